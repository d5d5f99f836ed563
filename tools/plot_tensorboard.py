"""Plot a run's loss and learning-rate curves as TensorBoard's own reader returns them.

    .venv/bin/python tools/plot_tensorboard.py build/tb_doc docs/img/tensorboard_curves.png

Reads every events.out.tfevents.* file under DIR with TensorBoard's event_accumulator (the reader
behind `tensorboard --logdir DIR`), then draws 'lm loss' (and 'lm loss validation' where the run
evaluated) and 'learning-rate' against the iteration with matplotlib (both from PyPI: make test-ref
installs them in .venv).
"""
import glob
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    logdir, out = sys.argv[1], sys.argv[2]
    files = sorted(glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True))
    if not files:
        print("no events.out.tfevents.* under %s (run ./train_gpt with --tensorboard-dir %s)" % (logdir, logdir))
        return 1
    series = {}
    for path in files:
        ea = event_accumulator.EventAccumulator(path, size_guidance={event_accumulator.SCALARS: 0})
        ea.Reload()
        for tag in ea.Tags()["scalars"]:
            series.setdefault(tag, []).extend((e.step, e.value) for e in ea.Scalars(tag))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for tag, style in (("lm loss", "-"), ("lm loss validation", "o--")):
        if tag in series:
            steps, values = zip(*sorted(series[tag]))
            ax1.plot(steps, values, style, label=tag)
    ax1.set_xlabel("iteration")
    ax1.set_ylabel("loss")
    ax1.set_title("lm loss (TensorBoard tag 'lm loss')")
    ax1.grid(alpha=0.3)
    ax1.legend()
    if "learning-rate" in series:
        steps, values = zip(*sorted(series["learning-rate"]))
        ax2.plot(steps, values, color="tab:orange")
    ax2.set_xlabel("iteration")
    ax2.set_ylabel("learning rate")
    ax2.set_title("learning rate (tag 'learning-rate')")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote %s from %s" % (out, ", ".join(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
