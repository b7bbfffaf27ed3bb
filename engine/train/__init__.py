"""Training: the base model, its draft heads, the n-gram table and fine-tunes (see each module)."""

from collections.abc import Callable

# What a trainer tells its caller after each step: progress(step, total steps, figures to show
# beside a progress bar, e.g. the loss). The command line draws the bar; the trainers never do.
Progress = Callable[[int, int, dict], None]
