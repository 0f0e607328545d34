"""A snapshot reads at a glance in a notebook, and says when a configure() is still pending."""

from __future__ import annotations

import numpy as np

import labserve
from labserve.lab.demo import SleepModel


def test_a_snapshot_is_one_short_line_naming_every_kind_of_outcome():
    runner = labserve.Runner(SleepModel(a_ms=0.1, b_ms=0.0), name="glance")
    try:
        runner.predict.run(np.ones((1, 4)))
        text = repr(runner.predict.stats())
    finally:
        runner.stop()
    assert text.startswith("<Snapshot glance.predict: 1 served, 0 refused, 0 rejected, 0 timed")
    assert "\n" not in text and len(text) < 300


def test_stats_right_after_configure_says_the_change_is_pending():
    runner = labserve.Runner(SleepModel(a_ms=0.1, b_ms=0.0), name="tuned")
    try:
        runner.predict.run(np.ones((1, 4)))  # the driver runs: changes wait for a batch
        runner.configure("predict", max_batch_size=4)
        snap = runner.predict.stats()
        if snap.config.max_batch_size == 4:  # a batch boundary came first: nothing pending
            assert snap.config_asked is None
        else:
            assert snap.config_asked is not None and snap.config_asked.max_batch_size == 4
            assert "(pending, from the next batch: max_batch_size=4)" in repr(snap)
            # And /stats carries it: the JSON round trip keeps it.
            assert labserve.snapshot_from_dict(snap.as_dict()).config_asked == snap.config_asked
        runner.predict.run(np.ones((1, 4)))
        after = runner.predict.stats()
        assert after.config.max_batch_size == 4 and after.config_asked is None
        assert "pending" not in repr(after)
    finally:
        runner.stop()


def test_a_fresh_snapshot_says_there_is_nothing_yet_instead_of_nan():
    runner = labserve.Runner(SleepModel(a_ms=0.1, b_ms=0.0), name="fresh")
    try:
        text = str(runner.predict.stats())
        runner.predict.run(np.ones((1, 4)))
        served = str(runner.predict.stats())
    finally:
        runner.stop()
    assert "nan" not in text
    assert "no batches yet | no latency in the window" in text
    assert "1 batches, mean 1.0 items | p50 " in served
