"""seedlab.store: atomic writes, hashes, verified reads, done markers, the folder lock."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from seedlab import store
from seedlab.errors import SeedlabError


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


# --------------------------------------------------------------------------- atomic writes


def test_atomic_write_failure_keeps_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    store.write_text(target, "old")
    assert target.read_text() == "old"

    def half_then_fail(p):
        p.write_text("new, torn")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        store.atomic_write(target, half_then_fail)
    assert target.read_text() == "old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]  # no .out.txt.*.tmp left behind
    # a failed first write creates nothing at all
    with pytest.raises(RuntimeError):
        store.atomic_write(tmp_path / "fresh.json", half_then_fail)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


def test_write_json_if_changed_leaves_an_equal_file_untouched(tmp_path):
    p = tmp_path / "config.json"
    store.write_json_if_changed(p, {"b": 1, "a": [1, 2]})
    past = 1_000_000_000
    os.utime(p, ns=(past, past))
    before = p.stat()
    store.write_json_if_changed(p, {"a": [1, 2], "b": 1})  # equal as JSON: not rewritten
    after = p.stat()
    assert after.st_mtime_ns == before.st_mtime_ns == past and after.st_ino == before.st_ino
    store.write_json_if_changed(p, {"a": [1, 2], "b": 2})
    assert p.stat().st_mtime_ns != past and json.loads(p.read_text()) == {"a": [1, 2], "b": 2}


def test_content_hash_is_stable_and_order_free():
    a = {"lr": 1e-3, "model": {"layers": 2, "heads": 1}, "seeds": [0, 1]}
    b = {"seeds": [0, 1], "model": {"heads": 1, "layers": 2}, "lr": 1e-3}
    assert store.content_hash(a) == store.content_hash(b)
    assert len(store.content_hash(a)) == 12 and len(store.content_hash(a, n=20)) == 20
    assert store.content_hash(a) != store.content_hash({**a, "lr": 2e-3})
    # the run-folder names on disk depend on it: pinned
    assert store.content_hash({"a": 1}) == "015abd7f5cc5"
    assert store.content_hash({"a": 1}, n=64) == "015abd7f5cc57a2dd94b7590f04ad8084273905ee33ec5cebeae62276a97f862"


def test_file_sha256_and_digest(tmp_path):
    p = tmp_path / "x.bin"
    p.write_bytes(b"abc")
    assert store.file_sha256(p) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    d = store.digest({"b": "2", "a": "1"})
    assert d == store.digest({"a": "1", "b": "2"}) and d != store.digest({"a": "1", "b": "3"})


# --------------------------------------------------------------------------- verified reads


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(4, 3, generator=g), "b": torch.arange(5, dtype=torch.int64)}


def test_write_safetensors_hashed_round_trip(tmp_path):
    t = _tensors()
    p = store.write_safetensors(tmp_path / "ck.safetensors", t, {"step": "7"}, hashed=True)
    got, meta = store.read_verified(p)
    assert set(got) == set(t) and all(torch.equal(got[k], t[k]) for k in t)
    assert meta["step"] == "7" and json.loads(meta["sha256"]) == store.tensor_hashes(t)
    # and against a manifest entry instead of the file's own hashes
    got2, _ = store.read_verified(p, expected=store.tensor_hashes(t))
    assert all(torch.equal(got2[k], t[k]) for k in t)


def test_read_verified_refuses_a_flipped_byte(tmp_path):
    p = store.write_safetensors(tmp_path / "ck.safetensors", _tensors(), hashed=True)
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0x01  # the data section is at the end; the header stays readable
    p.write_bytes(bytes(raw))
    with pytest.raises(SeedlabError) as e:
        store.read_verified(p)
    assert re.fullmatch(rf"{re.escape(str(p))}: tensor '[wb]' does not match its recorded SHA-256 \(corrupted checkpoint\)",
                        _one_line(e))


def test_read_verified_refuses_a_missing_tensor(tmp_path):
    t = _tensors()
    p = store.write_safetensors(tmp_path / "ck.safetensors", {"w": t["w"]})
    with pytest.raises(SeedlabError) as e:
        store.read_verified(p, expected=store.tensor_hashes(t))
    assert _one_line(e) == f"{p}: tensor 'b' is missing (corrupted checkpoint)"


def test_read_verified_refuses_a_file_without_hashes_or_unreadable(tmp_path):
    p = store.write_safetensors(tmp_path / "plain.safetensors", _tensors())  # hashed=False
    with pytest.raises(SeedlabError) as e:
        store.read_verified(p)
    assert _one_line(e) == f"{p}: no recorded hashes to check it against"
    store.read_verified(p, expected=store.tensor_hashes(_tensors()))  # a manifest entry still checks it
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 3)
    with pytest.raises(SeedlabError, match=r"junk\.safetensors: not a readable checkpoint") as e:
        store.read_verified(junk)
    _one_line(e)
    with pytest.raises(SeedlabError, match=r"absent\.safetensors: not a readable checkpoint") as e:
        store.read_verified(tmp_path / "absent.safetensors")
    _one_line(e)


def test_read_manifest_absent_or_unreadable_is_empty(tmp_path):
    assert store.read_manifest(tmp_path / "none.json") == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert store.read_manifest(tmp_path / "bad.json") == {}
    store.write_json(tmp_path / "m.json", {"step-0": {"w": "ab"}})
    assert store.read_manifest(tmp_path / "m.json") == {"step-0": {"w": "ab"}}


# --------------------------------------------------------------------------- markers and locks


def test_mark_done_and_is_done(tmp_path):
    job = tmp_path / "job"
    assert not store.is_done(job)
    p = store.mark_done(job, {"members": 4})
    assert p == job / store.DONE and store.DONE == "done.json"
    assert store.is_done(job) and json.loads(p.read_text()) == {"members": 4}


def test_folder_lock_refuses_a_second_holder(tmp_path):
    folder = tmp_path / "sweep"
    with store.folder_lock(folder):
        assert (folder / store.LOCK).read_text() == str(os.getpid())
        # flock locks belong to an open file description: a second open, even in this process, conflicts
        with pytest.raises(SeedlabError) as e:
            with store.folder_lock(folder, busy="{folder}: another sweep (pid {pid}) holds it"):
                pass
        assert _one_line(e) == f"{folder}: another sweep (pid {os.getpid()}) holds it"
    with store.folder_lock(folder):  # released on exit
        pass
