"""Beyond one process: the course's model under ``DistributedDataParallel`` (chapter 09).

``DataParallel`` is one process with a thread per replica, replicating the module every step.
DDP is one process per replica: each keeps its model for the whole run, and only gradients travel,
all-reduced in buckets while backward is still running.

* :mod:`.train`: the training entry point, ``torchrun --standalone --nproc-per-node 2 -m dpteach.distributed.train``
* :mod:`.launch`: :class:`Ranks` and :func:`run`, which start the ranks from a notebook themselves
* :mod:`.script`: an ordinary DDP script written to a file and run under ``torchrun`` from a cell
* :mod:`.loopback`: gloo on the loopback interface, for ranks that all run on this machine
* :mod:`.tasks`: what the notebook asks the ranks to do, addressed by name
* :mod:`.worker`: the rank side of ``Ranks``: join the group, run named tasks, report failures
* :mod:`.model`: the model, the data, and the one-process references DDP is checked against
* :mod:`.order`: reading ``tasks.bucket_order``'s events: buckets, and the backward work each can overlap
* :mod:`.compare`: gradients set side by side with where they came from; step times and copies of
  one process and DataParallel, to set beside DDP's
* :mod:`.plots`: the chapter's pictures (matplotlib, imported when used)
* :mod:`.exercise`: exercise 1's ``my_tasks.py``, written with one line to edit, and the exercises' checks
"""

from .launch import RankFailed, Ranks, RankTimeout, default_backend, run
from .model import data_parallel_gradients, loss_fn, make_data, make_model, sgd_step, single_device_gradients
from .script import torchrun, write_script

__all__ = [
    "Ranks",
    "run",
    "RankFailed",
    "RankTimeout",
    "default_backend",
    "make_model",
    "make_data",
    "loss_fn",
    "sgd_step",
    "single_device_gradients",
    "data_parallel_gradients",
    "torchrun",
    "write_script",
]
