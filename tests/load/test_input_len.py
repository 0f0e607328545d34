"""The load generator's length mix (input_len): in-process and over HTTP."""

import numpy as np
import pytest

import labserve
from labserve.load.mix import LengthMix, resize
from labserve.server import serve


class Tokens(labserve.Runnable):
    @labserve.method(batchable=True, max_latency_ms=5, strategy="fixed", pad=1)
    def encode(self, ids, lengths):
        mask = np.arange(ids.shape[1])[None, :] < lengths[:, None]
        return np.where(mask, ids, 0).sum(axis=1)


def test_resize_cuts_or_repeats_along_the_ragged_axis_and_a_dict_alike():
    x = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(resize(x, 2), [[1, 2]])
    np.testing.assert_array_equal(resize(x, 7), [[1, 2, 3, 1, 2, 3, 1]])
    d = resize({"input_ids": x, "attention_mask": np.ones((1, 3))}, 5)
    assert d["input_ids"].shape == d["attention_mask"].shape == (1, 5)
    with pytest.raises(ValueError, match="no ragged axis 1"):
        resize(np.ones(3), 2)


def test_a_mix_draws_the_same_lengths_for_a_seed_and_reuses_payloads():
    a = LengthMix("lognormal:16:128", np.ones((1, 4)), seed=7)
    b = LengthMix("lognormal:16:128", np.ones((1, 4)), seed=7)
    assert [a.length(k) for k in range(3000)] == [b.length(k) for k in range(3000)]
    n = a.length(5)
    assert a.payload(5).shape == (1, n)
    same = next(k for k in range(6, 3000) if a.length(k) == n)
    assert a.payload(same) is a.payload(5)


def test_load_test_sends_a_length_mix_and_reports_tokens_and_padding():
    runner = labserve.Runner(Tokens, name="tok")
    try:
        result = labserve.load_test(
            runner.encode,
            example=np.arange(1, 9)[None],
            input_len="uniform:1:64",
            concurrency=16,  # closed loop: no send schedule to fall behind on a busy machine
            duration_s=1.0,
        )
    finally:
        runner.stop()
    s = result.summary()
    assert s["served_rps"] > 0 and s["failed_pct"] == 0
    assert 0 < s["padding_pct"] < 100 and s["tokens_per_batch"] > 0


def test_over_http_the_server_view_reports_tokens_and_padding():
    runner = labserve.Runner(Tokens, name="tok")
    server = serve(runner)
    try:
        result = labserve.load_test(
            server.url + "/runners/tok/encode",
            example=np.arange(1, 9)[None],
            input_len="uniform:1:64",
            concurrency=16,
            duration_s=1.0,
        )
        with pytest.raises(TypeError, match="simple route only"):
            labserve.load_test(
                server.url + "/v2/models/tok/infer",
                example=np.ones((1, 4)),
                input_len=8,
                concurrency=1,
                duration_s=0.1,
            )
    finally:
        server.stop()
        runner.stop()
    s = result.summary()
    assert s["served_rps"] > 0
    assert 0 < s["padding_pct"] < 100 and s["tokens_per_batch"] > 0


def test_the_command_sends_a_length_mix_and_says_what_padding_cost(capsys):
    from labserve.cli import main

    runner = labserve.Runner(Tokens, name="tok")
    server = serve(runner)
    try:
        url = server.url + "/runners/tok/encode"
        argv = ["load", url, "--input-len", "uniform:1:32", "--concurrency", "8"]
        assert main([*argv, "--duration", "0.5", "--width", "8"]) == 0
    finally:
        server.stop()
        runner.stop()
    out = capsys.readouterr().out
    assert "padding_pct" in out and "tokens_per_batch" in out


def test_a_bad_length_spec_is_a_usage_error(capsys):
    from labserve.cli import main

    with pytest.raises(SystemExit) as info:
        main(["load", "http://127.0.0.1:9/runners/a/b", "--input-len", "lognormal:16"])
    assert info.value.code == 2
    assert "--input-len 'lognormal:16' is not a length spec" in capsys.readouterr().err
