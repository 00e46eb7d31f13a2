"""bench/round_profile.py on a synthetic bench/e2e.py --profile result: classes, totals, plain-step ratios, plot."""

from bench_scripts import load

ROUND = [("gemm_fusion_dot_3", 4.0), ("nvjet_sm90_tss_96x128", 2.0), ("anonymous_mosaic_gpu_kernel", 6.0),
         ("_ZN15stream_executor4cuda3RunILm4EfjEEvPT0_iS3_Pji", 12.0), ("sort_17_1", 1.5), ("triton_softmax_9", 2.0),
         ("input_reduce_fusion_31", 1.0), ("loop_pad_fusion_58", 1.0), ("loop_dynamic_update_slice_fusion_1", 1.0),
         ("fusion_1509", 1.5)]


def _row(config, batch, ms, sim, kernels):
    return dict(model="m", config=config, draft_vocab=0, batch=batch, context=512, sim=sim, accept=1.0, ms_round=ms,
                loop_profile=dict(round_kernels=kernels))


def test_classes_and_ratios(tmp_path):
    rp = load("round_profile")
    cls = rp.classify(ROUND)
    assert {c: v["kernels"] for c, v in cls.items() if v["kernels"]} == {
        "gemm": 2, "attention": 1, "top-k": 1, "sort": 1, "softmax": 1, "reduce": 1, "data movement": 2,
        "other fusions": 1}
    assert cls["gemm"]["us"] == 6.0 and cls["top-k"]["us"] == 12.0
    result = {"rows": [_row("plain", 8, 1.0, "-", ROUND[:3]), _row("chain", 8, 1.5, "engine sim mean 2.0", ROUND),
                       _row("chain", 8, 1.4, "engine sim mean 3.0", ROUND)]}
    entries = rp.table(result)
    assert [(e["config"], e["sim"]) for e in entries] == [("plain", "-"), ("chain", "engine sim mean 3.0")]
    assert entries[1]["plain_steps"] == 1.4 and entries[1]["kernels"] == len(ROUND)
    assert abs(entries[1]["kernel_us"] - sum(us for _, us in ROUND)) < 1e-9
    png = tmp_path / "p.png"
    rp.plot(entries, str(png))
    assert png.stat().st_size > 1000
