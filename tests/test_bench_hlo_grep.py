"""``bench/hlo_grep.py``: the loops an XLA:GPU executable leaves to the host, and what keeps them there."""

from bench_scripts import load

HLO = """HloModule jit__decode

%command_buffer.1 (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %w2 = f32[4]{0} while(%p), condition=%cond.5, body=%body.6
  ROOT %f = f32[4]{0} fusion(%w2), kind=kLoop, calls=%fused.1
}

%cond.2 (c: (s32[], f32[4])) -> pred[] {
  %c = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  ROOT %lt = pred[] call(%i), to_apply=%command_buffer.4
}

%body.3 (c: (s32[], f32[4])) -> (s32[], f32[4]) {
  %c = (s32[], f32[4]{0}) parameter(0)
  %x = f32[4]{0} get-tuple-element(%c), index=1
  %y = f32[4]{0} call(%x), to_apply=%command_buffer.1
  %z = f32[4]{0} fusion(%y), kind=kCustom, calls=%fused.3, backend_config={"fusion_backend_config":{"kind":"__dynamic_memcpy"}}, metadata={op_name="jit(_decode)/while/body/dynamic_update_slice"}
  %cc = f32[4]{0} custom-call(%z), custom_call_target="mosaic_gpu", metadata={op_name="jit(_decode)/attention"}
  ROOT %t = (s32[], f32[4]{0}) tuple(%c, %cc)
}

ENTRY %main (a: (s32[], f32[4])) -> (s32[], f32[4]) {
  %a = (s32[], f32[4]{0}) parameter(0)
  ROOT %w = (s32[], f32[4]{0}) while(%a), condition=%cond.2, body=%body.3
}
"""


def test_host_loops_names_what_keeps_a_loop_off_the_device():
    lines = load("hlo_grep").host_loops(HLO)
    assert lines[0] == "host-driven while w (in main): condition cond.2, body body.3"
    assert lines[1] == "  cond.2: 1 command buffers, 0 other instructions"
    assert lines[2] == "  body.3: 1 command buffers, 2 other instructions"
    assert lines[3] == "    fusion kind=__dynamic_memcpy op_name=jit(_decode)/while/body/dynamic_update_slice"
    assert lines[4] == "    custom-call target=mosaic_gpu op_name=jit(_decode)/attention"
    assert len(lines) == 5  # the while inside the command buffer (w2) is the device's


def test_host_loops_is_empty_when_every_loop_is_in_a_command_buffer():
    captured = HLO.replace("ROOT %w = (s32[], f32[4]{0}) while(%a), condition=%cond.2, body=%body.3",
                           "ROOT %w = (s32[], f32[4]{0}) call(%a), to_apply=%command_buffer.1")
    assert load("hlo_grep").host_loops(captured) == []
