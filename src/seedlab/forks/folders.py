"""A fork design's folder: where its files live, when a folder may be used, the environment it
was trained in, and how later stages open it. How each byte is written and checked: store.py.

The layout every fork design shares (a study's rundir.py subclasses these with its own files)::

    DIR/config.json                     the resolved config (and how it is run)
    DIR/inputs.json                     the corpus's hashes and the injected texts (checked on resume)
    DIR/environment.json                torch, CUDA, device, CPU, precision, threads, deterministic settings
    DIR/seed-<k>/prefix.safetensors     the shared prefix's complete state at the fork step
    DIR/seed-<k>/<arm>/                 one run (:class:`RunFolder`): step-<t>.safetensors, manifest.json,
                                        losses.parquet, state.safetensors (resume), done.json
    DIR/seed-<k>/replica/               the replica control: the twin trained again (hashes only)
    DIR/integrity.json                  what the runs were shown to be (identical before s, deterministic after)
    DIR/report.md, DIR/*.png            the report

- :meth:`DesignFolder.claim` — the folder policy: an absent or empty folder starts a design; the
  same design (config.json) resumes; anything else is refused unless ``force`` (which removes it).
- :meth:`DesignFolder.check_inputs` — a design resumes on the corpus (and the texts) it started with.
- :meth:`DesignFolder.check_environment` — bitwise identity is promised on one environment only
  (seedlab/machine.py ``environment``): resuming under another is refused in one line unless the
  user allows it (``--allow-env-change``).
- :func:`open_design` — config, inputs and the corpus (moved? re-prepared?) of a design on disk.

A fork command goes through these in one order, once: forks/start.py ``begin``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seedlab.errors import SeedlabError
from seedlab.machine import compare
from seedlab.store import LOCK, is_done, mark_done, read_manifest, read_verified, write_json, write_json_if_changed

if TYPE_CHECKING:
    from seedlab.lm.distributed import World


@dataclass(frozen=True)
class RunFolder:
    """The files of one training run of a fork design (a twins condition, an attribution bank's
    twin or candidate, a replica), named as every study's contract names them::

        step-<t>.safetensors   weights after t updates (state_dict keys)
        manifest.json          {t: {tensor: SHA-256}} of every saved or hashed step
        losses.parquet         (step, loss) of every update
        perturbation.json      what a perturbation arm's delta was (norm, weights moved, SHA-256)
        distances.parquet      (step, distance): ‖θ_run − θ_twin‖₂ per recorded step, where a design records it
                               (forks/distances.py)
        dose.json              the run's dose at the fork step s: θ, AdamW's m and v after the update of s against
                               its twin's (forks/dose.py; the twin's own: zeros)
        state.safetensors      the complete training state at the last checkpoint (resume; removed at the end)
        final.safetensors      the complete state at the end (kept only when the design asks)
        done.json              written last: the run finished
    """

    path: Path

    def checkpoint(self, step: int) -> Path:
        """Weights after ``step`` updates."""
        return self.path / f"step-{step}.safetensors"

    @property
    def manifest(self) -> Path:
        return self.path / "manifest.json"

    @property
    def losses(self) -> Path:
        return self.path / "losses.parquet"

    @property
    def perturbation(self) -> Path:
        """What the arm's weight perturbation did (its norm, how far the weights moved), when it has one."""
        return self.path / "perturbation.json"

    @property
    def distances(self) -> Path:
        """(step, distance): the run's distance to its seed's twin (forks/distances.py)."""
        return self.path / "distances.parquet"

    @property
    def dose(self) -> Path:
        """The run's dose at the fork step against its twin (forks/dose.py)."""
        return self.path / "dose.json"

    @property
    def state(self) -> Path:
        """The complete training state at the last checkpoint (removed when the run finishes)."""
        return self.path / "state.safetensors"

    @property
    def final_state(self) -> Path:
        """The complete training state at the end (kept when the design asks for it)."""
        return self.path / "final.safetensors"

    @property
    def finished(self) -> bool:
        return is_done(self.path)

    def mark_finished(self, steps: int) -> None:
        mark_done(self.path, {"steps": steps})

    def read_manifest(self) -> dict[str, dict[str, str]]:
        """``{step: {tensor: SHA-256}}`` of every step recorded so far (empty when there is none)."""
        return read_manifest(self.manifest)

    def weights(self, step: int) -> dict[str, Any]:
        """Weights after ``step`` updates, every tensor's SHA-256 checked against manifest.json."""
        expected = self.read_manifest().get(str(step))
        if expected is None or not self.checkpoint(step).is_file():
            raise SeedlabError(f"{self.path}: no checkpoint at step {step} (the run has not reached it)")
        return read_verified(self.checkpoint(step), expected)[0]

    def clear(self) -> None:
        """Remove what an interrupted run left (it starts over from the prefix)."""
        if self.path.exists():
            shutil.rmtree(self.path)


@dataclass(frozen=True)
class DesignFolder:
    """The top of a fork design's folder (see the module docstring). A study's rundir.py
    subclasses it; :meth:`run` places an arm's run (default ``seed-<k>/<arm>``)."""

    root: Path

    #: the study and what it calls one design, in messages ("twins" "run", "attribution" "bank")
    study = "fork"
    noun = "design"
    #: what the study calls one arm's run, in records ("condition", "run")
    arm_word = "arm"

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def inputs(self) -> Path:
        return self.root / "inputs.json"

    @property
    def lock(self) -> Path:
        """The lock file a command holds while it works in the folder (store.py ``folder_lock``)."""
        return self.root / LOCK

    @property
    def environment(self) -> Path:
        return self.root / "environment.json"

    def seed(self, seed: int) -> Path:
        """The folder of one seed's runs."""
        return self.root / f"seed-{seed}"

    def started(self) -> bool:
        """A run trained here before (a seed's folder exists): running it again resumes from its checkpoints."""
        return any(p.is_dir() for p in self.root.glob("seed-*"))

    def prefix(self, seed: int) -> Path:
        """The shared prefix's complete state at the fork step."""
        return self.seed(seed) / "prefix.safetensors"

    def prefix_at(self, seed: int, step: int) -> Path:
        """The shared prefix's complete state after ``step`` updates, before the fork step (kept for the arms
        that leave the prefix there: forks/arms.py ``Arm.start``)."""
        return self.seed(seed) / f"prefix-{int(step)}.safetensors"

    def run(self, seed: int, arm: str) -> RunFolder:
        """One arm's run of one seed."""
        return RunFolder(self.seed(seed) / arm)

    def replica(self, seed: int) -> RunFolder:
        """The replica control of a seed: its twin trained a second time (hashes, no weight files)."""
        return RunFolder(self.seed(seed) / "replica")

    @property
    def integrity(self) -> Path:
        return self.root / "integrity.json"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    def figure(self, name: str) -> Path:
        return self.root / name

    def read_config(self) -> dict:
        """config.json; a folder without it is not such a design (a one-line error)."""
        if not self.config.is_file():
            a = "an" if self.study[0] in "aeiou" else "a"
            raise SeedlabError(f"{self.root}: not {a} {self.study} {self.noun} folder (no config.json)")
        return json.loads(self.config.read_text())

    def read_inputs(self) -> dict:
        """inputs.json; a folder without it was never started here (a one-line error)."""
        if not self.inputs.is_file():
            raise SeedlabError(f"{self.root}: no inputs.json (an unfinished, foreign or older folder: run it again)")
        return json.loads(self.inputs.read_text())

    # ----------------------------------------------------------------------- before the first step

    def upgrade(self, old: dict) -> dict:
        """A config.json written by an older seedlab, as today's record would read (a study fills
        in the fields its config gained since); compared by :meth:`claim`."""
        return old

    def holds(self, old: dict, record: Mapping[str, Any]) -> bool:
        """Whether a folder whose config.json is ``old`` holds the design ``record`` (:meth:`claim`): its
        :meth:`upgrade` equal to it. A folder whose files serve more than one design (a match folder's kept
        prefixes) widens it, or refuses in one line of its own."""
        return self.upgrade(old) == dict(record)

    def claim(self, record: Mapping[str, Any], *, force: bool, world: World | None = None) -> None:
        """The folder policy, before anything is written: a folder holding another design (its
        config.json, as :meth:`upgrade` reads it, differs from ``record``: :meth:`holds`) is refused in one line unless
        ``force``, which removes it whatever it holds; the same design, interrupted, resumes. A folder
        holding nothing but the lock file (store.py ``folder_lock``) is empty."""
        from seedlab.lm.distributed import World

        out, world = self.root, world or World()
        if not (out.exists() and any(p.name != LOCK for p in out.iterdir())):
            return
        old = json.loads(self.config.read_text()) if self.config.is_file() else None
        if not force and (old is None or not self.holds(old, record)):
            what = (f"another {self.study} design (config.json differs)" if old is not None
                    else f"something else than a {self.study} design")
            raise SeedlabError(f"--out: {out} holds {what}; use another folder, or --force to overwrite it")
        world.barrier()  # every rank has compared before rank 0 removes anything
        if force and world.main:
            for p in out.iterdir():  # all but the lock file, which the command starting here may hold
                if p.name != LOCK:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        world.barrier()  # and no rank reads the folder before it is gone

    def started_inputs(self, inputs: Mapping[str, Any]) -> dict | None:
        """The inputs.json of a design started before (None: a new one), after checking that
        ``inputs`` (the same keys) name the same corpus: its hashes and end-of-text id."""
        if not self.inputs.is_file():
            return None
        old = json.loads(self.inputs.read_text())
        if old.get("corpus_sha256") != inputs["corpus_sha256"] or old.get("eot_id") != inputs["eot_id"]:
            raise SeedlabError(f"corpus: {inputs['corpus']} is not the corpus {self.root} was started with "
                               "(its hashes differ: re-prepared?); use that corpus, or --force to start over")
        return old

    def check_inputs(self, inputs: Mapping[str, Any]) -> None:
        """A design started before resumes only on the corpus it started with (:meth:`started_inputs`);
        a study's folder also compares the texts its inputs.json holds. Nothing is written here."""
        self.started_inputs(inputs)

    def check_environment(self, env: Mapping[str, Any], *, allow_change: bool) -> str | None:
        """A design started before resumes only in the environment it started in (torch, CUDA,
        device, CPU, precision, threads, deterministic settings: seedlab/machine.py ``environment``):
        bitwise identity is promised on one environment. A value that differs is refused in one line
        unless ``allow_change``. A key only one of the two records holds (a folder started by a seedlab
        that recorded fewer, or more) cannot be compared: it is not refused, and the returned one-line
        note names it (None: nothing to say). Nothing is written here."""
        if not self.environment.is_file():
            return None  # a new design, or one from a seedlab that did not record it (nothing to compare)
        first = json.loads(self.environment.read_text())["environment"]
        k, unmatched = compare(first, env)
        if k is not None and not allow_change:
            raise SeedlabError(f"environment: {self.root} was started with {k} = {first[k]!r}, now {env[k]!r} "
                               "(bitwise identity holds on one environment only); resume it there, or pass "
                               "--allow-env-change to go on and have the change recorded")
        then, now = ([key for key in unmatched if key not in rec] for rec in (first, env))
        said = [f"{', '.join(keys)} {what}" for keys, what in ((then, "not recorded then"), (now, "no longer recorded")) if keys]
        return f"note: environment: {self.root} was started by another seedlab ({'; '.join(said)}): not compared" if said else None

    def start(self, record: Mapping[str, Any], inputs: Mapping[str, Any], env: Mapping[str, Any]) -> None:
        """Once every input is checked, before the first step: config.json and inputs.json, each
        written once (a resumed design leaves them untouched), and environment.json (a resume
        under another environment, allowed, or recorded with other keys, is appended to its ``changes``)."""
        write_json_if_changed(self.config, record)
        if not self.inputs.is_file():
            write_json(self.inputs, inputs)
        if not self.environment.is_file():
            write_json(self.environment, {"environment": dict(env), "changes": []})
            return
        old = json.loads(self.environment.read_text())
        last = (old["changes"] or [old["environment"]])[-1]
        if dict(env) != last:
            write_json(self.environment, old | {"changes": [*old["changes"], dict(env)]})


def corpus_record(corpus: Any) -> dict[str, Any]:
    """The corpus's part of a design's inputs.json: where it was (``corpus``), its splits' hashes
    (``corpus_sha256``) and its end-of-text id: what :meth:`DesignFolder.started_inputs` checks on a
    resume and :func:`open_design` reads back. A study adds its own keys (texts) after these."""
    return {"corpus": str(corpus.path.resolve()), "corpus_sha256": corpus.split_hashes(), "eot_id": corpus.eot_id}


@dataclass(frozen=True)
class OnDisk:
    """A fork design on disk as later stages read it: its config (parsed), its inputs.json record,
    and its corpus (opened, hashes compared)."""

    cfg: Any  # the study's config
    inputs: dict
    corpus: Any  # seedlab.corpus.Corpus


def open_design(folder: DesignFolder, parse: Callable[[dict], Any], corpus: str | Path | None = None) -> OnDisk:
    """Read a design folder's config (``parse(record)``: the study's config, or a one-line error)
    and inputs, and open its corpus (``corpus``: where it is now, if it moved), checking its hashes
    against the design's. A folder that is not such a design, or a corpus that is not the one
    trained on, is a one-line error."""
    from seedlab.corpus import load

    cfg = parse(folder.read_config())
    inputs, noun = folder.read_inputs(), folder.noun
    path = Path(corpus or inputs["corpus"])
    if not (path / "meta.json").is_file():
        how = "pass --corpus" if corpus else f"the corpus has moved since the {noun} was trained: pass --corpus"
        raise SeedlabError(f"corpus: no prepared corpus at {str(path)!r} ({how})")
    c = load(path, verify=False)
    want = inputs.get("corpus_sha256")
    if want and c.split_hashes() != want:
        raise SeedlabError(f"corpus: {path} is not the corpus this {noun} was trained on (hashes differ)")
    return OnDisk(cfg, inputs, c)
