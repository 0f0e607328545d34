"""Torch tensors and pandas frames are batched natively; lists of strings keep working."""

import subprocess
import sys

import pytest

from labserve.base.errors import InputError
from labserve.batching.containers import Codec
from labserve.batching.queue import BatchQueue
from labserve.config.batching import BatchingConfig


def run_all(codec, calls, model, cap=64):
    """Admit every call, fire greedily, run ``model`` on each batch; each caller's result."""
    q = BatchQueue("m", codec, BatchingConfig(strategy="greedy", max_batch_size=cap))
    requests = [q.admit(args, now=0.0) for args in calls]
    results, batches = {}, []
    while not all(r.done for r in requests):
        for batch in q.poll(now=0.0).fire:
            inputs = batch.stack(codec)
            batches.append(inputs)
            for r, result, error in q.complete(batch, batch.split(codec, model(*inputs)), 0.0):
                assert error is None
                results[r.id] = result
            q.release(batch, now=0.0, ok=True)
    return [results[r.id] for r in requests], batches


def test_torch_tensors_are_stacked_and_split_as_tensors_keeping_dtype():
    torch = pytest.importorskip("torch")
    calls = [(torch.arange(6, dtype=torch.float16).reshape(2, 3) + i,) for i in range(3)]
    results, batches = run_all(Codec("m"), calls, lambda x: x * 2)
    assert len(batches) == 1 and isinstance(batches[0][0], torch.Tensor)
    assert batches[0][0].shape == (6, 3)
    for (x,), got in zip(calls, results, strict=True):
        assert isinstance(got, torch.Tensor) and got.dtype == torch.float16
        assert got.device == x.device
        assert torch.equal(got, x * 2)


def test_torch_tensors_split_across_batches_and_rejoin_on_axis_1():
    torch = pytest.importorskip("torch")
    x = torch.arange(20).reshape(2, 10)  # 10 items along axis 1
    results, batches = run_all(Codec("m", batch_dim=1), [(x,)], lambda t: t + 1, cap=4)
    assert [b[0].shape[1] for b in batches] == [4, 4, 2]
    assert torch.equal(results[0], x + 1)


def test_tensors_of_other_dtypes_do_not_share_a_batch():
    torch = pytest.importorskip("torch")
    calls = [(torch.ones(1, 2),), (torch.ones(1, 2, dtype=torch.int64),)]
    results, batches = run_all(Codec("m"), calls, lambda t: t)
    assert len(batches) == 2
    assert [r.dtype for r in results] == [torch.float32, torch.int64]


def test_a_tensor_without_the_batch_axis_is_refused_naming_its_shape():
    torch = pytest.importorskip("torch")
    with pytest.raises(InputError, match=r"tensor of shape \[3\] has no batch axis 1"):
        Codec("m", batch_dim=1).admit((torch.ones(3),))


def test_dataframes_batch_by_rows_and_each_caller_gets_its_own_rows_and_index():
    pd = pytest.importorskip("pandas")
    a = pd.DataFrame({"x": [1.0, 2.0], "y": [3, 4]}, index=["a0", "a1"])
    b = pd.DataFrame({"x": [5.0], "y": [6]}, index=["b0"])

    def model(df):
        return df.assign(z=df["x"] * df["y"])

    (ra, rb), batches = run_all(Codec("m"), [(a,), (b,)], model)
    assert len(batches) == 1 and len(batches[0][0]) == 3
    pd.testing.assert_frame_equal(ra, model(a))
    pd.testing.assert_frame_equal(rb, model(b))


def test_a_series_output_is_split_by_rows():
    pd = pytest.importorskip("pandas")
    a = pd.DataFrame({"x": [1.0, 2.0]}, index=[10, 11])
    b = pd.DataFrame({"x": [3.0]}, index=[12])
    (ra, rb), _ = run_all(Codec("m"), [(a,), (b,)], lambda df: df["x"] * 10)
    pd.testing.assert_series_equal(rb, b["x"] * 10)
    pd.testing.assert_series_equal(ra, a["x"] * 10)


def test_dataframes_with_other_columns_run_in_their_own_batches():
    pd = pytest.importorskip("pandas")
    calls = [(pd.DataFrame({"x": [1]}),), (pd.DataFrame({"w": [1]}),)]
    _, batches = run_all(Codec("m"), calls, lambda df: df)
    assert len(batches) == 2


def test_a_list_of_strings_is_batched_as_a_list():
    calls = [(["a", "bb"],), (["ccc"],)]
    results, batches = run_all(Codec("m"), calls, lambda names: [len(n) for n in names])
    assert batches == [(["a", "bb", "ccc"],)]
    assert results == [[1, 2], [3]]


def test_an_unknown_object_is_refused_naming_what_is_accepted():
    with pytest.raises(InputError, match="cannot batch a set; expected a numpy array, a torch"):
        Codec("m").admit(({1, 2},))


def test_importing_labserve_and_batching_numpy_imports_neither_torch_nor_pandas():
    code = (
        "import sys, numpy as np, labserve\n"
        "from labserve.batching.containers import Codec\n"
        "c = Codec('m'); args, n, key = c.admit((np.ones((2, 3)),))\n"
        "c.split(c.stack([args, args])[0], [2, 2])\n"
        "print(sorted(m for m in ('torch', 'pandas') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
