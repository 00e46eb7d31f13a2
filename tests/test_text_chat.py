"""Chat templates rendered by jaxspec.text.chat against transformers' own renderer
(``transformers.utils.chat_template_utils.render_jinja_template``) on templates that use what real ones use:
trim/lstrip blocks, ``tojson`` (non-ASCII kept), ``namespace``, loop controls, ``raise_exception``,
``strftime_now``, tools, the special-token variables, ``{% generation %}`` blocks; and the end-of-turn token."""

import pytest

from jaxspec.text.chat import ChatTemplateError, check_messages, end_of_turn_token, render_chat_template

CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_LIKE = """{{- bos_token }}
{%- set ns = namespace(sys='') %}
{%- for m in messages %}
    {%- if m['role'] == 'system' %}{% set ns.sys = m['content'] %}{% continue %}{% endif %}
    {%- if loop.index0 > 6 %}{% break %}{% endif %}
    {{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' }}
    {%- if m['role'] == 'assistant' %}{% generation %}{{ m['content'] | trim }}{% endgeneration %}
    {%- else %}{{ m['content'] | trim }}{% endif %}
    {{- '<|eot_id|>' }}
{%- endfor %}
{%- if ns.sys %}{{ '[system: ' + ns.sys + ']' }}{% endif %}
{%- if tools is not none %}
Tools: {{ tools | tojson(indent=2) }}
{%- for t in tools %} {{ t['name'] | tojson }}{% endfor %}
{%- endif %}
{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}
"""
BLOCKS = """{% for m in messages %}
  {% if m.role == 'user' %}
    U: {{ m.content }}
  {% elif m.role == 'assistant' %}
    A: {{ m.content }}{{ eos_token }}
  {% elif m.role == 'system' %}
    S: {{ m.content }}
  {% else %}
    {{ raise_exception('unknown role ' + m.role) }}
  {% endif %}
{% endfor %}
{% if add_generation_prompt %}A:{% endif %}
Year {{ strftime_now('%Y') }} {{ dict(a=1, b='ü') | tojson }} {{ extra_var | default('none') }}"""

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  Hi  "}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! 🤗"},
     {"role": "user", "content": "Café, 日本語 and \"quotes\" </s>"}],
    [{"role": "user", "content": f"turn {i}"} if i % 2 == 0 else {"role": "assistant", "content": f"reply {i}"}
     for i in range(9)],
]
SPECIAL = {"bos_token": "<|begin_of_text|>", "eos_token": "</s>", "pad_token": "<pad>"}
TOOLS = [{"name": "get_weather", "description": "Météo", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}}}]


@pytest.fixture(scope="module")
def hf_render():
    ct = pytest.importorskip("transformers.utils.chat_template_utils")

    def render(template, conv, **kw):
        return ct.render_jinja_template(conversations=[conv], chat_template=template, **kw)[0][0]
    return render


@pytest.mark.parametrize("template", [CHATML, LLAMA3_LIKE, BLOCKS], ids=["chatml", "llama3-like", "blocks"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_equals_transformers(hf_render, template, add_generation_prompt):
    for conv in CONVERSATIONS:
        for tools in (None, TOOLS):
            for extra in ({}, {"extra_var": "x"}, {"eos_token": "<override>"}):
                want = hf_render(template, conv, add_generation_prompt=add_generation_prompt, tools=tools,
                                 **{**SPECIAL, **extra})
                got = render_chat_template(template, conv, add_generation_prompt=add_generation_prompt, tools=tools,
                                           special_tokens=SPECIAL, **extra)
                assert got == want, (conv, tools, extra)


def test_none_values_are_dropped_as_transformers_does(hf_render):
    """apply_chat_template drops keys whose value is None before rendering (``_normalize_chat_messages``)."""
    tpl = "{% for m in messages %}{{ m.role }}{% if m.tool_calls is defined %}!{% endif %}{% endfor %}"
    got = render_chat_template(tpl, [{"role": "user", "content": "hi", "tool_calls": None}])
    assert got == "user" == hf_render(tpl, [{"role": "user", "content": "hi"}])


def test_errors_name_what_is_wrong():
    with pytest.raises(ChatTemplateError, match="unknown role tool"):
        render_chat_template(BLOCKS, [{"role": "tool", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="not a valid Jinja2 template"):
        render_chat_template("{% for %}", [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match=r"messages\[1\]: a message needs a 'role'"):
        check_messages([{"role": "user", "content": "a"}, {"content": "b"}])
    with pytest.raises(ValueError, match="expected at least one message"):
        check_messages([])
    with pytest.raises(ValueError, match="expected a list of message dicts"):
        check_messages("hello")
    # the sandbox: no attribute escapes, no underscore names on a namespace
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ messages.__class__.__mro__ }}", [{"role": "user", "content": "x"}])
    with pytest.raises(Exception, match="underscore"):
        render_chat_template("{% set ns = namespace(_x=1) %}", [{"role": "user", "content": "x"}])


def test_end_of_turn_token():
    cands = ("<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|start_header_id|>", "</s>", "<s>")
    assert end_of_turn_token(CHATML, {}, cands) == "<|im_end|>"
    assert end_of_turn_token(LLAMA3_LIKE, SPECIAL, cands) == "<|eot_id|>"
    assert end_of_turn_token(BLOCKS, SPECIAL, cands) == "</s>"
    assert end_of_turn_token("{% for m in messages %}{{ m.content }}\n{% endfor %}", {}, cands) is None
    # a template that refuses the probe conversation has no end-of-turn token to offer
    assert end_of_turn_token("{{ raise_exception('no') }}", {}, cands) is None
