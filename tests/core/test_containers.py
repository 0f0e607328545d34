import numpy as np
import pytest

from labserve.base.errors import InputError
from labserve.batching.containers import Codec, TensorSpec


def rows(n, width=3, start=0, dtype=np.float64):
    """``n`` distinct rows of ``width`` values, so every row is recognisable after a split."""
    return (np.arange(n * width).reshape(n, width) + start).astype(dtype)


def stack_and_split(codec, requests, model):
    """What a driver does: admit, stack, run the model, split back per request."""
    admitted = [codec.admit(args) for args in requests]
    counts = [items for _, items, _ in admitted]
    stacked = codec.stack([args for args, _, _ in admitted])
    return codec.split(model(*stacked), counts), counts


def test_arrays_are_counted_stacked_and_split_on_axis_0():
    codec = Codec("m")
    a, b = rows(3), rows(2, start=100)
    parts, counts = stack_and_split(codec, [(a,), (b,)], lambda x: x * 10)
    assert counts == [3, 2]
    np.testing.assert_array_equal(parts[0], a * 10)
    np.testing.assert_array_equal(parts[1], b * 10)


def test_arrays_are_counted_stacked_and_split_on_axis_1():
    codec = Codec("m", batch_dim=1)
    a, b = rows(3, width=4).T, rows(2, width=4, start=100).T  # items along axis 1
    stacked = codec.stack([(a,), (b,)])
    assert stacked[0].shape == (4, 5)
    parts, counts = stack_and_split(codec, [(a,), (b,)], lambda x: x + 1)
    assert counts == [3, 2]
    np.testing.assert_array_equal(parts[0], a + 1)
    np.testing.assert_array_equal(parts[1], b + 1)


def test_batch_dim_pair_stacks_inputs_and_splits_outputs_on_different_axes():
    codec = Codec("m", batch_dim=(0, 1))
    a, b = rows(3), rows(2, start=100)
    parts, counts = stack_and_split(codec, [(a,), (b,)], lambda x: x.T)  # items move to axis 1
    assert counts == [3, 2]
    np.testing.assert_array_equal(parts[0], a.T)
    np.testing.assert_array_equal(parts[1], b.T)
    assert codec.output_items(a.T) == 3


def test_lists_are_counted_by_length_and_split_in_order():
    codec = Codec("m")
    parts, counts = stack_and_split(
        codec, [(["a", "b"],), (["c"],), (["d", "e", "f"],)], lambda xs: [s.upper() for s in xs]
    )
    assert counts == [2, 1, 3]
    assert parts == [["A", "B"], ["C"], ["D", "E", "F"]]


def test_dicts_of_arrays_are_stacked_and_split_key_by_key():
    codec = Codec("m")
    r1 = {"x": rows(2), "mask": np.array([True, False])}
    r2 = {"x": rows(3, start=50), "mask": np.array([False, True, True])}
    parts, counts = stack_and_split(
        codec, [(r1,), (r2,)], lambda d: {"y": d["x"].sum(axis=1), "m": ~d["mask"]}
    )
    assert counts == [2, 3]
    for part, req in zip(parts, [r1, r2], strict=True):
        assert set(part) == {"y", "m"}
        np.testing.assert_array_equal(part["y"], req["x"].sum(axis=1))
        np.testing.assert_array_equal(part["m"], ~req["mask"])


def test_tuples_of_arrays_are_stacked_and_split_element_by_element():
    codec = Codec("m")
    r1 = (rows(2), rows(2, width=1, start=7))
    r2 = (rows(1, start=30), rows(1, width=1, start=90))
    parts, counts = stack_and_split(codec, [(r1,), (r2,)], lambda t: (t[0] * 2, t[1] - 1))
    assert counts == [2, 1]
    for part, req in zip(parts, [r1, r2], strict=True):
        assert isinstance(part, tuple)
        np.testing.assert_array_equal(part[0], req[0] * 2)
        np.testing.assert_array_equal(part[1], req[1] - 1)


def test_multiple_positional_arguments_are_stacked_argument_by_argument():
    codec = Codec("m")
    x1, w1 = rows(2), np.array([1.0, 2.0])
    x2, w2 = rows(3, start=10), np.array([3.0, 4.0, 5.0])
    stacked = codec.stack([codec.admit((x1, w1))[0], codec.admit((x2, w2))[0]])
    assert len(stacked) == 2
    np.testing.assert_array_equal(stacked[0], np.concatenate([x1, x2]))
    np.testing.assert_array_equal(stacked[1], np.concatenate([w1, w2]))
    parts, counts = stack_and_split(codec, [(x1, w1), (x2, w2)], lambda x, w: x * w[:, None])
    assert counts == [2, 3]
    np.testing.assert_array_equal(parts[0], x1 * w1[:, None])
    np.testing.assert_array_equal(parts[1], x2 * w2[:, None])


@pytest.mark.parametrize("batch_dim", [0, 1, 2])
def test_split_after_stack_gives_back_each_request(batch_dim):
    rng = np.random.default_rng(batch_dim)
    codec = Codec("m", batch_dim=batch_dim)
    requests = []
    for n in rng.integers(1, 6, size=7):
        shape = [2, 3, 4]
        shape[batch_dim] = int(n)
        requests.append((rng.normal(size=shape),))
    counts = [codec.admit(r)[1] for r in requests]
    assert counts == [r[0].shape[batch_dim] for r in requests]
    stacked = codec.stack(requests)
    assert stacked[0].shape[batch_dim] == sum(counts)
    for part, req in zip(codec.split(stacked[0], counts), requests, strict=True):
        np.testing.assert_array_equal(part, req[0])


@pytest.mark.parametrize("width", [3, 4096])  # small: views; large: copies of their own
def test_one_item_per_request_splits_into_rows_that_keep_the_batch_axis(width):
    codec = Codec("m")
    requests = [(rows(1, width, start=100 * i),) for i in range(5)]
    stacked = codec.stack(requests)[0]
    parts = codec.split(stacked * 2, [1] * 5)
    for part, (x,) in zip(parts, requests, strict=True):
        assert part.shape == (1, width)
        np.testing.assert_array_equal(part, x * 2)
    big = stacked.nbytes * 2 >= 1 << 16
    assert all((p.base is None) == big for p in parts)  # a large batch is not pinned


def test_slice_and_join_rebuild_a_request_split_across_batches():
    codec = Codec("m", batch_dim=1)
    x = rows(5).T  # 5 items along axis 1
    pieces = [codec.slice((x,), a, b)[0] for a, b in [(0, 2), (2, 4), (4, 5)]]
    assert [p.shape[1] for p in pieces] == [2, 2, 1]
    np.testing.assert_array_equal(codec.join(pieces), x)


def test_arguments_with_different_item_counts_are_refused():
    codec = Codec("m")
    with pytest.raises(InputError, match=r"\[2, 3\]") as info:
        codec.admit((rows(2), rows(3)))
    assert info.value.status == 400


def test_dict_parts_with_different_item_counts_are_refused():
    with pytest.raises(InputError, match="different numbers of items"):
        Codec("m").admit(({"a": rows(2), "b": rows(4)},))


def test_a_request_with_zero_items_is_refused():
    with pytest.raises(InputError, match="0 items"):
        Codec("m").admit((np.zeros((0, 3)),))
    with pytest.raises(InputError, match="0 items"):
        Codec("m").admit(([],))


def test_a_call_without_arguments_is_refused():
    with pytest.raises(InputError, match="at least one argument"):
        Codec("m").admit(())


def test_an_array_without_the_batch_axis_is_refused():
    with pytest.raises(InputError, match="no batch axis 1"):
        Codec("m", batch_dim=1).admit((np.ones(4),))


@pytest.mark.parametrize("value", [3, "text", {1, 2}, {}, ()])
def test_an_unbatchable_value_is_refused(value):
    with pytest.raises(InputError):
        Codec("m").admit((value,))


def test_signature_separates_trailing_shape_and_dtype_but_not_item_count():
    codec = Codec("m")

    def key(x):
        return codec.admit((x,))[2]

    assert key(rows(2)) == key(rows(5))
    assert key(rows(2)) != key(rows(2, width=4))
    assert key(rows(2)) != key(rows(2, dtype=np.float32))


def test_input_spec_mismatch_names_the_shape_sent_and_expected():
    codec = Codec("m", input_spec=TensorSpec("float32", (3,)))
    with pytest.raises(InputError) as info:
        codec.admit((np.ones((2, 4), dtype=np.float32),))
    message = str(info.value)
    assert "float32[2, 4]" in message
    assert "float32[N, 3]" in message
    assert info.value.status == 400


def test_input_spec_shows_the_batch_axis_where_it_is():
    codec = Codec("m", batch_dim=1, input_spec=TensorSpec("float64", (3,)))
    with pytest.raises(InputError, match=r"expected float64\[3, N\]"):
        codec.admit((np.ones((4, 2)),))


def test_input_spec_rejects_an_unsafe_dtype_and_casts_a_safe_one():
    codec = Codec("m", input_spec=TensorSpec("float32", (3,)))
    with pytest.raises(InputError, match="sent complex128"):
        codec.admit((np.ones((2, 3), dtype=np.complex128),))
    args, items, _ = codec.admit((np.ones((2, 3), dtype=np.float64),))
    assert items == 2
    assert args[0].dtype == np.float32


def test_input_spec_reads_lists_as_arrays_of_its_dtype():
    codec = Codec("m", input_spec=TensorSpec("float32", (2,)))
    args, items, _ = codec.admit(([[1, 2], [3, 4], [5, 6]],))
    assert items == 3
    assert isinstance(args[0], np.ndarray)
    assert args[0].dtype == np.float32


def test_input_spec_wildcard_accepts_any_size_on_that_axis():
    codec = Codec("m", input_spec=TensorSpec("float64", (-1, 2)))
    for width in (1, 7):
        assert codec.admit((np.ones((3, width, 2)),))[1] == 3
    with pytest.raises(InputError):
        codec.admit((np.ones((3, 7, 3)),))


def test_input_spec_checks_the_number_of_arguments():
    codec = Codec("m", input_spec=[TensorSpec("float64", (2,)), TensorSpec("int64", ())])
    assert codec.admit((np.ones((4, 2)), np.arange(4)))[1] == 4
    with pytest.raises(InputError, match="takes 2 argument"):
        codec.admit((np.ones((4, 2)),))


def test_tensor_spec_normalises_dtype_and_validates_shape():
    assert TensorSpec("f4", [3]) == TensorSpec("float32", (3,))
    with pytest.raises(TypeError, match="dtype"):
        TensorSpec("not-a-dtype")
    with pytest.raises(TypeError, match="shape"):
        TensorSpec("float32", (-2,))
    with pytest.raises(TypeError, match="shape"):
        TensorSpec("float32", (True,))


@pytest.mark.parametrize("batch_dim", [True, (0,), (0, 1, 2), "0", 1.0])
def test_codec_refuses_a_malformed_batch_dim(batch_dim):
    with pytest.raises(TypeError, match="batch_dim"):
        Codec("m", batch_dim=batch_dim)


def test_codec_refuses_a_negative_batch_dim():
    with pytest.raises(ValueError, match="batch_dim"):
        Codec("m", batch_dim=(0, -1))


def test_parts_of_a_large_batch_own_their_memory_and_small_ones_may_share_it():
    codec = Codec("m")
    big = np.arange(16 * 4096, dtype=np.float64).reshape(16, 4096)  # 512 KiB
    parts = codec.split(big, [1] * 16)
    assert all(p.base is None and p.flags.owndata for p in parts)
    np.testing.assert_array_equal(np.concatenate(parts), big)
    small = np.arange(16 * 4, dtype=np.float64).reshape(16, 4)
    np.testing.assert_array_equal(np.concatenate(codec.split(small, [8, 8])), small)
