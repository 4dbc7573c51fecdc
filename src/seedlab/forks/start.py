"""The one start of a fork command (``twins run``, ``twins match``, the attribution bank, a design
of your own), from Python as from the CLI. :func:`begin`, in this order, before the first step:

1. **claim** the folder (forks/folders.py ``DesignFolder.claim``: the folder policy; ``force``);
2. **inputs**: a design started before resumes on the same corpus and texts (``DesignFolder.check_inputs``);
3. **settle** the process (lm/determinism.py ``settle``: CPU threads, deterministic kernels), which
   holds a bf16 precision to the precision policy (seedlab/precision.py: refused where it cannot
   run, a warning where it is emulated);
4. the **environment** record (seedlab/machine.py ``environment``) and its check against the one the
   folder started in (``DesignFolder.check_environment``; ``allow_env_change``); a key only one of
   the two records holds is a one-line note on stderr, not a refusal;
5. the study's own **checks** (``checks``: the twins' pre-registration and disk plan);
6. the **lock** (store.py ``folder_lock``): one command in a folder at a time, held until the block ends
   (a folder some command has locked before is locked before step 1, so ``--force`` never removes a folder in use);
7. the **first files** (config.json, inputs.json, environment.json, and a study's own:
   ``first_files``), written when :meth:`Started.first_files` is called: forks/loop.py
   ``run_design`` calls it (``Design.start``) once every arm is checked; a command without arms
   calls it at once.

Every check of 1-5 is a one-line :class:`~seedlab.errors.SeedlabError` and writes nothing. A
process that works for a started command (a bank's seed in a process of its own) settles and
records its environment the same way (:func:`settled`), and must find the command's. Under
torchrun every rank runs steps 1-5; rank 0 alone takes the lock and writes.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seedlab.errors import SeedlabError
from seedlab.forks.folders import DesignFolder
from seedlab.lm.determinism import settle
from seedlab.lm.distributed import World
from seedlab.machine import compare, environment
from seedlab.store import folder_lock


@dataclass(frozen=True)
class Started:
    """A fork command past its checks, its folder locked: the environment it runs in (as
    environment.json records it) and the writer of its first files."""

    folder: DesignFolder
    env: dict[str, Any]
    write: Callable[[dict[str, Any]], None]

    def first_files(self) -> None:
        """Write the design's first files (rank 0; a resumed design's are left as they are)."""
        self.write(self.env)


def settled(device: torch.device, threads: int | None, precision: str, *, like: Mapping[str, Any] | None = None,
            of: str = "the command's") -> dict[str, Any]:
    """Settle this process for ``device`` (threads, deterministic kernels, the precision policy) and
    return its environment record. ``like``: the record of the command this process works for
    (``of`` names it in the error, e.g. "the bank's"); any other is a one-line error."""
    settle(device, threads, precision)
    env = environment(device, precision)
    if like is not None:
        k, unmatched = compare(like, env)
        k = k if k is not None else next(iter(unmatched), None)  # one seedlab: a key missing from one is a change
        if k is not None:
            raise SeedlabError(f"environment: {k} = {env.get(k)!r} in its process, {like.get(k)!r} in {of}")
    return env


@contextlib.contextmanager
def begin(folder: DesignFolder, record: Mapping[str, Any], inputs: Mapping[str, Any], *, device: torch.device,
          precision: str, threads: int | None, force: bool = False, allow_env_change: bool = False,
          world: World | None = None, checks: Sequence[Callable[[], object]] = (),
          first_files: Callable[[dict[str, Any]], None] | None = None) -> Iterator[Started]:
    """Start a fork command in ``folder`` (the steps of the module docstring) and hold its lock for the block.

    ``record``: what makes the folder hold the same design (compared by ``claim``; by default also
    config.json); ``inputs``: inputs.json's record (compared by ``check_inputs``); ``device``,
    ``precision``, ``threads``: how this process computes; ``checks``: the study's own, run after the
    environment's (what they return is ignored); ``first_files(env)``: writes the first files
    (default: ``folder.start(record, inputs, env)``)."""
    world = world or World()
    busy = f"--out: {{folder}} is in use by another {folder.noun} (pid {{pid}}); wait for it or stop it"
    held = world.main and folder.lock.is_file()  # a folder a command has locked before is locked first: --force never removes one in use
    with folder_lock(folder.root, busy) if held else contextlib.nullcontext():
        folder.claim(record, force=force, world=world)
        folder.check_inputs(inputs)
        env = settled(device, threads, precision)
        note = folder.check_environment(env, allow_change=allow_env_change)
        if note is not None and world.main:
            print(note, file=sys.stderr)
        for check in checks:
            check()
        write = first_files or (lambda env: folder.start(record, inputs, env))
        with folder_lock(folder.root, busy) if world.main and not held else contextlib.nullcontext():
            yield Started(folder, env, write)
