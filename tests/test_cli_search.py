"""``labserve search``: the table and the best setting; one-line errors with exit status 2."""

from __future__ import annotations

import pytest

from labserve.cli import main

TINY = ["--input-len", "8", "--output-len", "8", "--duration", "4", "--warmup", "0.5"]


def test_search_prints_the_table_and_the_best_setting(capsys):
    argv = ["search", *TINY, "--targets", "ttft:60 tpot:5", "--max-num-seqs", "1,8"]
    assert main([*argv, "--cost", "2,0.2,0,0", "--export", "vllm"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["strategy", "scheduling_policy", "max_num_seqs"]
    assert out[1].split()[2] == "8"  # best rate first: 8 sequences share each step's 2 ms
    best = next(line for line in out if line.startswith("best: "))
    assert "max_num_seqs=8" in best
    assert any(line.strip() == "--max-num-seqs 8 \\" for line in out)


def test_search_exact_runs_the_reference_and_agrees_within_the_tolerance(capsys):
    argv = ["search", *TINY, "--targets", "ttft:60 tpot:5", "--max-num-seqs", "8"]
    rates = []
    for extra in ([], ["--exact"]):
        assert main([*argv, "--cost", "2,0.2,0,0", *extra]) == 0
        best = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("best: "))
        rates.append(float(best.split()[1]))
    assert rates[0] != rates[1]  # the reference bisects from a guess, not on the lattice
    assert 1 / 1.02 <= rates[0] / rates[1] <= 1.02


def test_search_over_fleets_prints_replicas_routers_and_the_router_export(capsys):
    argv = ["search", "--input-len", "16", "--output-len", "4", "--duration", "6"]
    argv += ["--warmup", "1", "--targets", "ttft:150 tpot:40", "--max-num-seqs", "4"]
    argv += ["--prefix-len", "128", "--num-prefixes", "8", "--prefix-caching", "on"]
    argv += ["--replicas", "2", "--routers", "round_robin,prefix_affinity"]
    assert main([*argv, "--cost", "10,1,0.1,0", "--export", "sglang-router"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["replicas", "router"]
    rows = [line.split() for line in out[1:3]]
    assert {r[1] for r in rows} == {"round_robin", "prefix_affinity"}
    best = next(line for line in out if line.startswith("best: "))
    assert "sessions/s with replicas=2" in best
    assert any("--policy" in line for line in out)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--strategies", "eager"], "strategy must be one of"),
        (["--targets", "speed:3"], "got the key 'speed'"),
        (["--chunked", "maybe"], "argument --chunked: expected on and/or off"),
        (["--prefix-caching", "yes"], "argument --prefix-caching: expected on and/or off"),
        (["--replicas", "0"], "replicas must be numbers > 0"),
        (["--routers", "nearest"], "router"),
        (["--cost", "1,2"], "cost takes 4 comma-separated terms"),
        (["--attainment", "2"], "attainment must be a share"),
        (["--max-num-seqs", "0"], "max-num-seqs must be numbers > 0"),
        (["--duration", "0"], "durations must be > 0"),
        (["--warmup", "9"], "warmup_s must be"),
    ],
)
def test_search_bad_arguments_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["search", *TINY, *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
