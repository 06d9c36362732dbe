"""``fleetlite.hapi.progressbar.ProgressBar`` writes Paddle's text: the
expected strings below follow ``python/paddle/hapi/progressbar.py`` (``update``: ``name %Nd/num``, the bar of
``width`` characters, ``' - k: %.4f'`` or ``%.4e`` at or below 1e-3, ``' - ETA: ...'``, ``' - %.0fms/step'``)."""

import io

import numpy as np
import pytest

import fleetlite.hapi.progressbar as pb
from fleetlite.hapi.progressbar import ProgressBar


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(pb.time, "time", lambda: now[0])
    monkeypatch.setenv("COLUMNS", "120")  # a wide terminal: the bar keeps its width of 30
    return now


def test_verbose_2_one_line_per_update(clock, capsys):
    bar = ProgressBar(num=10, verbose=2)
    clock[0] += 0.036  # 12 ms per step after 3 steps
    bar.update(3, [("loss", 0.5), ("acc", [0.75, 0.0001]), ("lr", np.array([0.25], np.float32))])
    clock[0] += 0.084
    bar.update(10, [("loss", [np.float32(2.0)])])
    assert capsys.readouterr().out == ("step  3/10 - loss: 0.5000 - acc: 0.7500 1.0000e-04 - lr: 0.2500 - 12ms/step\n"
                                       "step 10/10 - loss: 2.0000 - 12ms/step\n")


def test_verbose_1_draws_a_bar_in_place_with_eta(clock):
    out = io.StringIO()
    bar = ProgressBar(num=10, verbose=1, file=out, name="batch")
    clock[0] += 6.0  # 2 s per step after 3 steps: ETA 14 s
    bar.update(3, [("loss", 0.5)])
    first = "batch  3/10 [========>.....................] - loss: 0.5000 - ETA: 14s - 2s/batch"
    assert out.getvalue() == "\r" + first
    clock[0] += 14.0
    bar.update(10)
    last = "batch 10/10 [==============================] - 2s/batch"
    pad = " " * (len(first) - len(last))
    assert out.getvalue() == "\r" + first + "\b" * len(first) + "\r" + last + pad + "\n"


def test_unknown_total_and_long_eta_and_argument_checks(clock, capsys):
    bar = ProgressBar(verbose=2)
    clock[0] += 0.0000005
    bar.update(1, {"loss": 1e-5})
    assert capsys.readouterr().out == "step   1 - loss: 1.0000e-05 - 0us/step\n"
    bar = ProgressBar(num=1000, verbose=1)
    clock[0] += 20.0  # 2 s per step after 10: ETA 1980 s = 33:00
    bar.update(10)
    assert "step   10/1000 [" in capsys.readouterr().out
    assert pb._eta(1980.0) == "33:00" and pb._eta(3725.0) == "1:02:05"
    with pytest.raises(TypeError, match="num should be None or integer"):
        ProgressBar(num=0)
    ProgressBar(num=5, verbose=0).update(1, [("loss", 1.0)])
    assert capsys.readouterr().out == ""


def _paddle_count(name, current, num):
    """Paddle's count text: ``(name + ' %Nd/%d') % (current, num)``, N the digits of num (%-formatting, so a
    float step is written as its integer part)."""
    if num:
        return (name + " %" + str(int(np.log10(num)) + 1) + "d/%d") % (current, num)
    return name + " %3d" % (current,)  # noqa: UP031 (Paddle's %-format, on purpose)


@pytest.mark.parametrize("verbose", [1, 2, 3])
@pytest.mark.parametrize("epochs", [1, 2])
def test_paddle_test_progressbar_cases(clock, capsys, verbose, epochs):
    """Paddle's ``test/legacy_test/test_progressbar.py`` ``prog_bar(num, epoch, width, verbose)``: ints, 'INF',
    1e-4, one-element float arrays, a uint16 array, step 0, float steps (1e4, 1 + 1e-4) and ``num=None``."""
    num = 50
    values = [["loss", 50.341673], ["acc", 0.00256]]
    for _ in range(epochs):
        bar = ProgressBar(num, verbose=verbose)
        for step in range(1, num + 1):
            values[0][1] -= 0.05
            values[1][1] += 0.05
            if step % 10 == 0:
                bar.update(step, values)
            clock[0] += 0.002
        bar.update(step, values)
    for v in (1, "INF", 1e-4, np.array([1.0]), np.array([1e-4]), np.array([1]).astype(np.uint16)):
        bar.update(1, [["loss", v]])
    bar.start()
    bar.update(0, values)
    bar._dynamic_display = False
    capsys.readouterr()
    bar.update(1e4, values)
    float_step = capsys.readouterr().out
    assert _paddle_count("step", 1e4, num) == "step 10000/50"
    assert float_step.lstrip("\n").startswith("step 10000/50")
    bar._num = None
    bar.update(0, values)
    bar._num = 1
    capsys.readouterr()
    bar.update(1 + 1e-4, values)
    assert capsys.readouterr().out.lstrip("\n").startswith(_paddle_count("step", 1 + 1e-4, 1))


def test_paddle_values_text_for_each_kind(clock, capsys):
    """The value text of Paddle's ``update`` for the kinds its test passes (verbose=2: ``' %s'`` for an int,
    a string and a uint16 array; ``%.4f``/``%.4e`` for floats and one-element float arrays)."""
    bar = ProgressBar(5, verbose=2)
    for v in (1, "INF", 1e-4, np.array([1.0]), np.array([1e-4]), np.array([1]).astype(np.uint16)):
        bar.update(1, [["loss", v]])
    lines = [ln.split(" - ")[1] for ln in capsys.readouterr().out.splitlines()]
    assert lines == ["loss: 1", "loss: INF", "loss: 1.0000e-04", "loss: 1.0000", "loss: 1.0000e-04", "loss: [1]"]
    with pytest.raises(TypeError, match="num should be None or integer"):
        ProgressBar(-1)
