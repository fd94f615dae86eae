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


def test_request_gpu_log_asks_xla_gpu_and_keeps_what_the_user_set(
    monkeypatch):
  env = {"TF_CPP_MIN_LOG_LEVEL": "1"}  # jax's own default
  monkeypatch.setattr(M.os, "environ", env)  # this process's is untouched
  assert not M.gpu_log_requested()
  M.request_gpu_log()
  assert env == {"TF_CPP_VMODULE": "hlo_memory_scheduler=2",
                 "TF_CPP_MIN_LOG_LEVEL": "0"}
  assert M.gpu_log_requested()
  env.update(TF_CPP_VMODULE="spmd_partitioner=3", TF_CPP_MIN_LOG_LEVEL="2")
  M.request_gpu_log()
  assert env == {"TF_CPP_VMODULE": "spmd_partitioner=3",
                 "TF_CPP_MIN_LOG_LEVEL": "2"}
  assert not M.gpu_log_requested()


def test_stderr_logged_reads_the_estimates_and_passes_warnings_on(capfd):
  """What XLA:GPU writes to fd 2 during a compile: the estimates are read,
  INFO messages (a multi-line one too) dropped, warnings written on."""
  warning = "W1129 09:34:07.1  7 gpu_compiler.cc:1] something to see\n"
  with M.stderr_logged() as got:
    os.write(2, (LOG_25 + "I1129 09:34:07.2  7 subprocess_compilation.cc:349]"
                 " ptxas warning : Registers are spilled\n\n" + warning
                 + "a line of its own\n").encode())
  assert got["chose"] == "dfs" and got["dfs"] == round(2.62 * 2**30)
  assert capfd.readouterr().err == warning + "a line of its own\n"
  with M.stderr_logged() as nothing:
    pass
  assert nothing == {}


# mixtral_mini v5p-16 4x2 b64 s2048 full (`validate --dump_passes=memory-
# scheduler`, session 37): XLA kept the list schedule. The module before the
# pass (whole: the heap replay runs the loops' bodies) and the entry
# computation after it; metadata and backend configs removed.
LOG_MIXTRAL = """\
I1128 12:08:01.000000  1 hlo_memory_scheduler.cc:688] Min-memory list sequence: 3.33GiB
I1128 12:08:01.000000  1 hlo_memory_scheduler.cc:699] Min-memory dfs sequence: 4.69GiB
I1128 12:08:01.000000  1 hlo_memory_scheduler.cc:711] Min-memory post order sequence: 4.88GiB
I1128 12:08:01.000000  1 hlo_memory_scheduler.cc:726] Chose min-memory list sequence: 3.33GiB
"""


def test_the_list_replay_runs_the_big_work_where_xla_did():
  """Positions differ among ties (the many scalars and small copies, whose
  order follows the computation's insertion order, which the text does not
  keep); the loops, and every buffer of 256 MiB or more, come within ten
  positions of XLA's, and the output projection's weight gradient
  (fusion.392, f32[16000,1024]) runs before the layers' backward loop
  (while.322), as the list scheduler's greed for freed bytes puts it: it is
  the last reader of the f32 logits (fusion.452's second result, 1.95
  GiB)."""
  module = M.read_module(_text("mixtral_v5p16.before.hlo.gz"))
  c = module.computations[module.entry]
  xla = list(M.read_entry(_text("mixtral_v5p16.after.hlo.gz")).instructions)
  replayed = M.list_order(c, module)
  assert sorted(replayed) == sorted(xla)
  loops = lambda order: [n for n in order  # noqa: E731
                         if c.instructions[n].opcode == "while"]
  assert loops(replayed) == loops(xla)
  big = [n for n in xla if M.defined_bytes(c.instructions[n]) >= 2**28]
  assert len(big) >= 5
  for n in big:
    assert abs(replayed.index(n) - xla.index(n)) <= 10, n
  for order in (replayed, xla):
    assert order.index("fusion.392") < order.index("while.322")
  # the DFS order runs it after the loop, holding the logits through it
  dfs = M.dfs_order(c)
  assert dfs.index("fusion.392") > dfs.index("while.322")


def test_a_torn_dump_is_named_by_its_file(tmp_path):
  from simulator.xla import memory_scheduler
  name = f"module_0001.jit_step.before_{memory_scheduler.PASS}.txt"
  (tmp_path / name).write_text("HloModule torn, garbage")
  (tmp_path / name.replace("before_", "after_")).write_text("garbage")
  with pytest.raises(ValueError, match=f"^{tmp_path}/{name}: no entry "
                     "computation"):
    memory_scheduler.replay(str(tmp_path))
