"""The sampler never gives a bad id or NaN: every finite row at every temperature in [0, 2]
gives an id in the vocabulary, and a bad row or id raises a ValueError (Hypothesis).

Run with numpy's floating-point errors raising, so a computation that overflows or divides
by zero where the sampler has not said it may is a failure, not a silent inf.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from labserve.generation.sampling import SamplingParams, SequenceSampler, TextDecoder

FLOAT_DTYPES = [np.float16, np.float32, np.float64]
TINIEST = 5e-324  # the smallest subnormal float64


@pytest.fixture(autouse=True)
def _fp_errors_raise():
    with np.errstate(all="raise"):
        yield


def sampler(temperature=1.0, seed=None, vocab_size=None, token_bytes=None):
    params = SamplingParams(max_tokens=4, temperature=temperature, seed=seed)
    text = TextDecoder(token_bytes or (lambda t: bytes((t,))))
    return SequenceSampler(params, text, vocab_size=vocab_size)


@st.composite
def finite_rows(draw, min_size=1):
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    extremes = np.finfo(dtype)
    elements = st.one_of(
        hnp.from_dtype(np.dtype(dtype), allow_nan=False, allow_infinity=False),
        st.sampled_from([extremes.max, extremes.min, extremes.tiny, 0.0, -0.0]).map(dtype),
    )
    return draw(hnp.arrays(dtype, st.integers(min_size, 40), elements=elements))


temperatures = st.floats(0, 2)  # subnormals included


@settings(max_examples=300, deadline=None)
@given(row=finite_rows(), temperature=temperatures, seed=st.integers(-(2**63), 2**64 - 1))
@example(row=np.array([1e308, -1e308]), temperature=TINIEST, seed=0)
@example(row=np.array([-1e308, 1e308, 1e308]), temperature=2.0, seed=0)
@example(row=np.array([1.0, 0.0], dtype=np.float16), temperature=TINIEST, seed=-1)
def test_every_finite_row_at_every_temperature_gives_an_id_in_the_vocabulary(
    row, temperature, seed
):
    s = sampler(temperature, seed, vocab_size=row.size)
    token = s.choose(row)
    assert type(token) is int
    assert 0 <= token < row.size
    assert row[token] == row.max() or temperature > 0


@settings(max_examples=200, deadline=None)
@given(row=finite_rows(min_size=2), data=st.data())
def test_as_the_temperature_goes_to_0_the_draw_is_the_argmax(row, data):
    x = row.astype(np.float64)
    top = x.max()
    rest = x[x < top]
    if rest.size == 0:  # every logit ties: no temperature prefers one
        return
    gap = min(float(top) - float(rest.max()), 1e300)  # exp(-gap / T) == 0 once gap / T > 745
    temperature = data.draw(st.floats(0, gap / 800), label="temperature")
    token = sampler(temperature, seed=data.draw(st.integers(0, 2**32))).choose(row)
    assert x[token] == top
    if np.count_nonzero(x == top) == 1:
        assert token == int(np.argmax(row))


def test_greedy_takes_the_lowest_id_among_tied_highest_logits():
    row = np.array([0.0, 3.0, -1.0, 3.0])
    assert sampler(temperature=0).choose(row) == 1


def test_a_subnormal_temperature_samples_among_tied_maxima_only():
    # T -> 0 puts all the mass on the highest logits; equal ones stay equally likely.
    row = np.array([3.0, 1.0, 3.0, 2.999])
    s = sampler(temperature=TINIEST, seed=7)
    drawn = {s.choose(row) for _ in range(200)}
    assert drawn == {0, 2}


def test_sampling_follows_softmax_of_the_row_over_the_temperature():
    row = np.array([0.0, np.log(3.0), -50.0])
    s = sampler(temperature=1.0, seed=1)
    counts = np.bincount([s.choose(row) for _ in range(8000)], minlength=3)
    assert counts[2] == 0
    assert counts[1] / counts[0] == pytest.approx(3.0, rel=0.1)
    s = sampler(temperature=2.0, seed=1)  # softmax(row / 2): sqrt(3) to 1
    counts = np.bincount([s.choose(row) for _ in range(8000)], minlength=3)
    assert counts[1] / counts[0] == pytest.approx(3.0**0.5, rel=0.1)


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(finite_rows(), min_size=1, max_size=8),
    temperature=st.floats(0, 2, exclude_min=True),
    seed=st.integers(-(2**63), 2**64 - 1),
)
def test_the_same_seed_gives_the_same_draws(rows, temperature, seed):
    a, b = sampler(temperature, seed), sampler(temperature, seed)
    assert [a.choose(r) for r in rows] == [b.choose(r) for r in rows]


def test_a_negative_seed_is_taken_modulo_2_to_the_64():
    row = np.zeros(1000)
    draws = {seed: [sampler(1.0, seed).choose(row) for _ in range(1)] for seed in (-1, 2**64 - 1)}
    assert draws[-1] == draws[2**64 - 1]
    many = [sampler(1.0, seed) for seed in (-1, -(2**63), 2**64 - 1, 0)]
    firsts = [[s.choose(row) for _ in range(20)] for s in many]
    assert firsts[0] == firsts[2] and firsts[0] != firsts[3] and firsts[1] != firsts[3]


@settings(max_examples=200, deadline=None)
@given(
    row=finite_rows(),
    bad=st.sampled_from([np.nan, np.inf, -np.inf]),
    data=st.data(),
    temperature=temperatures,
)
def test_a_row_with_nan_or_an_infinity_raises_at_every_temperature(row, bad, data, temperature):
    at = data.draw(st.integers(0, row.size - 1), label="at")
    row[at] = bad
    with pytest.raises(ValueError, match="must be finite") as raised:
        sampler(temperature, seed=0, vocab_size=row.size).choose(row)
    assert f"of {row.size} values" in str(raised.value)


def test_the_error_for_a_non_finite_row_counts_what_is_wrong():
    row = np.zeros(256, dtype=np.float32)
    row[[3, 9, 11]] = np.nan
    row[5] = -np.inf
    with pytest.raises(ValueError) as raised:
        sampler(temperature=0).choose(row)
    assert str(raised.value) == (
        "the model's logits row for this sequence has 3 NaN and 1 infinite of 256 values; "
        "a row must be finite"
    )


@pytest.mark.parametrize("row", [np.zeros((2, 4)), np.zeros(0), np.zeros(5)])
def test_a_row_of_the_wrong_shape_raises(row):
    with pytest.raises(ValueError, match=r"expected one row of 4 values"):
        sampler(temperature=0, vocab_size=4).choose(row)


def test_a_row_that_is_not_numbers_raises():
    with pytest.raises(ValueError, match="must hold real numbers"):
        sampler(temperature=1.0).choose(np.array(["a", "b"]))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_token_id_the_model_chose_is_checked_against_the_vocabulary(temperature):
    s = sampler(temperature, vocab_size=256)
    assert s.choose(np.int64(255)) == 255
    with pytest.raises(ValueError) as raised:
        s.choose(300)
    assert str(raised.value) == "the model chose token id 300, outside the vocabulary 0..255"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        s.choose(-1)
    unbounded = sampler(temperature)
    assert unbounded.choose(10**6) == 10**6
    with pytest.raises(ValueError, match="must be >= 0"):
        unbounded.choose(-1)


@pytest.mark.parametrize("vocab_size", [0, -3, 2.5, True])
def test_a_bad_vocab_size_is_refused(vocab_size):
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 1"):
        sampler(vocab_size=vocab_size)


def test_push_refuses_an_id_outside_the_vocabulary_and_gives_out_nothing():
    s = sampler(temperature=0, vocab_size=256)
    assert s.push(ord("a"), last=False) == ("a", False)
    for bad in (256, -1):
        with pytest.raises(ValueError, match=r"outside the vocabulary 0\.\.255"):
            s.push(bad, last=False)
    assert s.text_out == "a"


def test_push_without_a_vocabulary_lets_the_byte_table_refuse():
    # TinyLM's table is bytes((id,)): an id past 255 cannot be read, and says so.
    s = sampler(temperature=0)
    with pytest.raises(ValueError, match=r"bytes must be in range"):
        s.push(300, last=False)
    with pytest.raises(ValueError, match="must be >= 0"):
        s.push(-1, last=False)  # a table indexed by id would wrap around silently


def test_a_detokeniser_that_gives_the_wrong_type_raises():
    s = sampler(temperature=0, token_bytes=lambda t: t)
    with pytest.raises(ValueError, match=r"token_bytes\(65\) gave a int; expected bytes"):
        s.push(65, last=False)
    text = TextDecoder(decode=lambda ids: None)
    with pytest.raises(ValueError, match="expected a string"):
        text.push(1)
