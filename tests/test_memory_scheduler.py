"""XLA's memory schedules replayed on dumped modules (simulator.xla.
memory_scheduler): the replay must give, instruction for instruction, the
order libtpu's scheduler kept."""

import gzip
import os
import random
import subprocess
import sys

import pytest

from simulator.xla import memory_scheduler as M

DATA = os.path.join(os.path.dirname(__file__), "data", "memory_scheduler")
# Corpus #25 (gpt2 v5p-8 4x1 b16 s1024 full dp): XLA kept the DFS schedule
# (libtpu's log: list 2.94, DFS 2.62, post order 3.04 GiB). Corpus #2 (gpt2
# v5p-8 1x4 b8 s512 dots adafactor): it kept the post order, the order the
# module was already printed in, so its dump before the pass is the one after.
# Entry computations of `validate --dump_passes=memory-scheduler`, metadata
# and backend configs removed.
LOG_25 = """\
I1128 09:03:56.876388    9114 hlo_memory_scheduler.cc:688] Min-memory list sequence: 2.94GiB
I1128 09:03:56.880582    9114 hlo_memory_scheduler.cc:699] Min-memory dfs sequence: 2.62GiB
I1128 09:03:56.884386    9114 hlo_memory_scheduler.cc:711] Min-memory post order sequence: 3.04GiB
I1128 09:03:56.884561    9114 hlo_memory_scheduler.cc:726] Chose min-memory dfs sequence: 2.62GiB
"""


def _text(name: str) -> str:
  with gzip.open(os.path.join(DATA, name), "rt") as f:
    return f.read()


def _dump_dir(tmp_path, before: str, after: str) -> str:
  """The two files `validate --dump_passes=memory-scheduler` writes."""
  stem = "module_0000.jit_step.cl_1"
  (tmp_path / f"{stem}.0000.final_scheduler.after_host-memory-transfer-"
   "asyncifier.before_hlo-memory-scheduler-with-brkga-fallback.txt"
   ).write_text(before)
  (tmp_path / f"{stem}.0001.final_scheduler.after_hlo-memory-scheduler-with-"
   "brkga-fallback.before_constant-deferring.txt").write_text(after)
  return str(tmp_path)


def test_the_dfs_replay_is_the_order_xla_kept(tmp_path):
  r = M.replay(_dump_dir(tmp_path, _text("corpus25.before.hlo.gz"),
                         _text("corpus25.after.hlo.gz")))
  assert len(r.xla) == 290
  assert r.dfs == r.xla
  # not the order the module came in: the post order differs nearly
  # everywhere, so the DFS statistics (extra users, tiled bytes) decide
  assert r.agreement(r.post) < 10


def test_the_post_order_replay_does_not_read_the_text_order():
  text = _text("corpus2.hlo.gz")
  xla = list(M.read_entry(text).instructions)
  head, *body = [l for l in text.splitlines()
                 if l.strip() and not l.startswith("}")]
  random.Random(0).shuffle(body)
  shuffled = M.read_entry("\n".join([head, *body, "}"]))
  assert list(shuffled.instructions) != xla
  assert M.post_order(shuffled) == xla
  assert len(xla) == 653


def test_tiled_sizes_decide_ties():
  """A scalar takes one 512-byte tile, which is what puts #25's copy.336
  (an s32[]) before iota_multiply_fusion.1 in XLA's DFS order."""
  assert M.tiled_array_bytes("s32[]{:T(128)}") == [512]
  assert M.tiled_array_bytes("f32[12,768]{1,0:T(8,128)}") == [16 * 768 * 4]
  assert M.tiled_array_bytes("(bf16[4,1024,768]{2,1,0:T(8,128)(2,1)}, s32[])") == [
      4 * 1024 * 768 * 2, 4]


def test_libtpu_log_sizes_and_choice():
  log = M.read_log(LOG_25)
  assert log["chose"] == "dfs"
  assert log["dfs"] < log["list"] < log["post order"]
  assert log["dfs"] == round(2.62 * 2**30)
  assert M.read_log("nothing here") == {}


def test_a_directory_without_pass_dumps_says_how_to_make_them(tmp_path):
  with pytest.raises(FileNotFoundError, match="--dump_passes=memory-scheduler"):
    M.replay(str(tmp_path))


def test_schedule_replay_prints_the_agreement_and_fails_in_one_line(tmp_path):
  d = _dump_dir(tmp_path, _text("corpus25.before.hlo.gz"),
                _text("corpus25.after.hlo.gz"))
  run = lambda *a: subprocess.run(  # noqa: E731
      [sys.executable, "-m", "experiments.schedule_replay", *a],
      capture_output=True, text=True, timeout=300)
  ok = run(f"--dump_dir={d}", "--min_mib=16")
  assert ok.returncode == 0, ok.stderr
  assert "DFS schedule replayed:     290 of 290" in ok.stdout
  assert "while." in ok.stdout
  for bad in ([f"--dump_dir={tmp_path / 'missing'}"],
              [f"--dump_dir={d}", "--log=x"],
              [f"--dump_dir={tmp_path}", "--min_mib=-1"]):
    r = run(*bad)
    assert r.returncode == 2, (bad, r.stderr)
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")


def test_request_log_keeps_a_vmodule_the_user_set(monkeypatch):
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_foo=1")
  M.request_log()
  assert os.environ["LIBTPU_INIT_ARGS"] == "--xla_foo=1 " + M.LOG_FLAG
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--vmodule=spmd=3")
  M.request_log()
  assert os.environ["LIBTPU_INIT_ARGS"] == "--vmodule=spmd=3"


def test_logged_reads_only_what_libtpu_logged_during_the_block(
    tmp_path, monkeypatch):
  monkeypatch.setenv("TPU_LOG_DIR", str(tmp_path))
  log = tmp_path / f"tpu_driver.vm.root.log.INFO.20261128-090000.{os.getpid()}"
  # an earlier compile's lines, logged before the block
  log.write_text(LOG_25.replace("dfs sequence: 2.62", "dfs sequence: 9.99")
                 .replace("Chose min-memory dfs", "Chose min-memory list"))
  with M.logged() as got:
    with open(log, "a") as f:
      f.write(LOG_25)
  assert got["chose"] == "dfs" and got["dfs"] == round(2.62 * 2**30)
  with M.logged() as nothing:
    pass
  assert nothing == {}
