"""The ragged axis: a padded batch gives every caller what it gets alone."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labserve.base.errors import InputError, PaddedOutputError
from labserve.batching.containers import Codec, Padding, TensorSpec
from labserve.batching.queue import BatchQueue
from labserve.config.batching import BatchingConfig

PAD = -7.0  # a pad value a careless model would notice


def masked_model(x, lengths):
    """Per row: a running sum over its true tokens, and their mean (padding masked out)."""
    mask = np.arange(x.shape[1])[None, :] < lengths[:, None]
    kept = np.where(mask, x, 0.0)
    return {"tokens": np.cumsum(kept, axis=1), "mean": kept.sum(axis=1) / np.maximum(lengths, 1)}


def unmasked_model(x, lengths):
    """The same model ignoring the lengths: padding leaks into every row's mean."""
    return {"tokens": np.cumsum(x, axis=1), "mean": x.mean(axis=1)}


def run_all(codec, calls, model, **settings):
    """Drive a BatchQueue by hand as a driver does: admit all, fire, stack, call, split."""
    q = BatchQueue("m", codec, BatchingConfig(strategy="greedy", **settings))
    requests = [q.admit(args, now=0.0) for args in calls]
    results = {}
    batches = []
    while not all(r.done for r in requests):
        step = q.poll(now=0.0)
        assert step.fire, "a greedy queue with a free slot fires"
        for batch in step.fire:
            batches.append(batch)
            output = codec.bind(model)(*batch.stack(codec))
            for r, result, error in q.complete(batch, batch.split(codec, output), now=0.0):
                assert error is None
                results[r.id] = result
            q.release(batch, now=0.0, ok=True)
    return [results[r.id] for r in requests], batches


def alone(codec, args, model):
    (result,), _ = run_all(codec, [args], model, max_batch_size=10_000)
    return result


def assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


# A request: an array of n rows of one length, or a list of rows of their own lengths.
lengths = st.integers(1, 12)
array_request = st.tuples(st.integers(1, 4), lengths).map(
    lambda nl: np.arange(1, nl[0] * nl[1] + 1, dtype=np.float64).reshape(nl) / 7.0
)
rows_request = st.lists(lengths, min_size=1, max_size=4).map(
    lambda ls: [list(np.arange(1, n + 1, dtype=np.float64) * (i + 1)) for i, n in enumerate(ls)]
)
requests = st.lists(st.one_of(array_request, rows_request), min_size=1, max_size=8)
paddings = st.builds(
    Padding,
    axis=st.just(1),
    pad_value=st.just(PAD),
    pad_to_multiple_of=st.sampled_from([None, 4, 8]),
    padding_side=st.sampled_from(["right", "left"]),
    output_axis=st.just({"tokens": 1}),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=requests, padding=paddings, cap=st.integers(1, 9))
def test_a_padded_batch_gives_every_caller_what_it_gets_alone(calls, padding, cap):
    if padding.padding_side == "left":
        model = left_masked_model
    else:
        model = masked_model
    codec = Codec("m", padding=padding)
    together, batches = run_all(codec, [(c,) for c in calls], model, max_batch_size=cap)
    for call, got in zip(calls, together, strict=True):
        assert_same(got, alone(codec, (call,), model))
    # Requests of different lengths really shared batches (the point of padding).
    if len(calls) > 1 and cap >= sum(len(c) for c in calls):
        assert len(batches) == 1


def left_masked_model(x, lengths):
    """masked_model for left padding: the true tokens are each row's last ``length``."""
    width = x.shape[1]
    mask = np.arange(width)[None, :] >= (width - lengths)[:, None]
    kept = np.where(mask, x, 0.0)
    return {"tokens": np.cumsum(kept, axis=1), "mean": kept.sum(axis=1) / np.maximum(lengths, 1)}


@settings(max_examples=100, deadline=None)
@given(calls=requests, cap=st.integers(1, 9))
def test_outputs_match_the_model_run_on_each_row_unpadded(calls, cap):
    codec = Codec("m", padding=Padding(axis=1, pad_value=PAD, output_axis={"tokens": 1}))
    together, _ = run_all(codec, [(c,) for c in calls], masked_model, max_batch_size=cap)
    for call, got in zip(calls, together, strict=True):
        rows = [np.asarray(r, dtype=np.float64) for r in call]
        for i, row in enumerate(rows):
            want = masked_model(row[None], np.array([len(row)]))
            tokens = got["tokens"][i]
            np.testing.assert_allclose(np.ravel(tokens), want["tokens"][0])
            np.testing.assert_allclose(got["mean"][i], want["mean"][0])


def test_an_unmasked_model_fails_the_same_property():
    """The property is not vacuous: a model blind to the lengths is caught by it."""
    codec = Codec("m", padding=Padding(axis=1, pad_value=PAD, output_axis={"tokens": 1}))
    calls = [(np.ones((1, 3)),), (np.ones((1, 9)),)]
    together, batches = run_all(codec, calls, unmasked_model, max_batch_size=8)
    assert len(batches) == 1 and batches[0].width == 9
    with pytest.raises(AssertionError):
        assert_same(together[0], alone(codec, calls[0], unmasked_model))


def test_a_batch_records_its_width_and_true_tokens():
    codec = Codec("m", padding=Padding(axis=1, pad_to_multiple_of=8))
    _, (batch,) = run_all(
        codec,
        [(np.ones((2, 3)),), ([[1.0, 2], [1.0, 2, 3, 4, 5]],)],
        masked_model,
        max_batch_size=8,
    )
    assert (batch.items, batch.width, batch.tokens, batch.true_tokens) == (4, 8, 32, 13)


def test_a_dict_of_named_arrays_is_padded_consistently():
    seen = {}

    def model(batch):
        seen.update(batch)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        return {"hidden": ids * mask, "pooled": (ids * mask).sum(1)}

    padding = Padding(
        axis=1, pad_value={"input_ids": 99}, output_axis={"hidden": 1}, lengths_arg=None
    )
    codec = Codec("m", padding=padding)
    a = {"input_ids": np.array([[5, 6, 7]]), "attention_mask": np.ones((1, 3), dtype=np.int64)}
    b = {"input_ids": np.array([[8]]), "attention_mask": np.ones((1, 1), dtype=np.int64)}
    (ra, rb), _ = run_all(codec, [(a,), (b,)], model, max_batch_size=8)
    np.testing.assert_array_equal(seen["input_ids"], [[5, 6, 7], [8, 99, 99]])
    np.testing.assert_array_equal(seen["attention_mask"], [[1, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(rb["hidden"], [[8]])
    np.testing.assert_array_equal(rb["pooled"], [8])
    np.testing.assert_array_equal(ra["hidden"], [[5, 6, 7]])


def test_a_request_larger_than_the_cap_is_split_and_each_part_padded_with_its_batch():
    codec = Codec("m", padding=Padding(axis=1, pad_value=PAD, output_axis={"tokens": 1}))
    big = [[1.0] * n for n in (2, 9, 3, 4, 1)]
    together, batches = run_all(codec, [(big,), (np.ones((1, 5)),)], masked_model, max_batch_size=3)
    assert [b.items for b in batches] == [3, 3]
    assert [b.width for b in batches] == [9, 5]  # the second: rows of 4, 1 and the other's 5
    assert_same(together[0], alone(codec, (big,), masked_model))


def test_ragged_inputs_of_other_lengths_in_one_request_fail_at_admission():
    codec = Codec("m", padding=Padding(axis=1))
    bad = {"input_ids": np.ones((1, 4)), "attention_mask": np.ones((1, 3))}
    with pytest.raises(InputError, match=r"input_ids.*\[4\].*attention_mask.*\[3\]"):
        codec.admit((bad,))


def test_rows_whose_other_axes_differ_fail_at_admission_naming_both_shapes():
    codec = Codec("m", padding=Padding(axis=1))
    with pytest.raises(InputError, match=r"\[1\]: a row of shape \[2, 3\].*row 0's \[4, 2\]"):
        codec.admit(([np.ones((4, 2)), np.ones((2, 3))],))


def test_an_array_without_the_ragged_axis_fails_at_admission():
    with pytest.raises(InputError, match="no ragged axis 1"):
        Codec("m", padding=Padding(axis=1)).admit((np.ones(3),))


def test_no_ragged_input_at_all_fails_at_admission():
    with pytest.raises(InputError, match="no input has it"):
        Codec("m", padding=Padding(axis=1)).admit((["some", "strings"],))


def test_a_list_of_strings_beside_a_ragged_input_stays_a_list():
    codec = Codec("m", padding=Padding(axis=1, keys=(0,), lengths_arg=None))
    (ra, rb), _ = run_all(
        codec,
        [(np.ones((1, 2)), ["a"]), (np.ones((1, 4)), ["b"])],
        lambda x, names: [f"{n}:{x.shape[1]}" for n in names],
        max_batch_size=8,
    )
    assert (ra, rb) == (["a:4"], ["b:4"])


def test_an_output_of_the_wrong_width_on_the_ragged_axis_is_a_typed_error():
    codec = Codec("m", padding=Padding(axis=1, output_axis=1, lengths_arg=None))
    q = BatchQueue("m", codec, BatchingConfig(strategy="greedy"))
    q.admit((np.ones((1, 2)),), now=0.0)
    q.admit((np.ones((1, 5)),), now=0.0)
    (batch,) = q.poll(now=0.0).fire
    with pytest.raises(PaddedOutputError, match=r"width 4.*expected the padded batch's width 5"):
        batch.split(codec, np.ones((2, 4)))


def test_the_ragged_axis_must_be_free_in_the_input_spec():
    with pytest.raises(TypeError, match="must leave the ragged axis 1 free"):
        Codec("m", input_spec=TensorSpec("int64", (8,)), padding=1)
    codec = Codec("m", input_spec=TensorSpec("int64", (-1,)), padding=1)
    args, items, _ = codec.admit(([[1, 2], [3]],))
    assert items == 2 and args[0].data.dtype == np.int64


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"axis": -1}, "axis must be an integer >= 0"),
        ({"pad_to_multiple_of": 0}, "pad_to_multiple_of must be an integer >= 1"),
        ({"padding_side": "middle"}, "padding_side must be 'right' or 'left'"),
        ({"pad_value": "x"}, "pad_value must be a number"),
        ({"output_axis": -2}, "output_axis must be None"),
        ({"lengths_arg": "not a name"}, "lengths_arg must be a keyword name"),
    ],
)
def test_a_bad_padding_spec_names_the_rule(kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        Padding(**kwargs)


def test_the_ragged_axis_cannot_be_the_batch_axis():
    with pytest.raises(ValueError, match="must not be the batch axis"):
        Codec("m", padding=Padding(axis=0))
