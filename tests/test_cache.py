"""simulator.cache: results kept by everything that determines them."""

import dataclasses
import glob
import os
import pickle

from simulator import search
from simulator.cache import Cache, code_version
from simulator.group_estimate import GroupEstimate


def test_a_key_changes_with_any_part_and_with_the_code(monkeypatch):
  a = Cache.key(model="tiny", batch=8)
  assert a == Cache.key(batch=8, model="tiny")
  assert a != Cache.key(model="tiny", batch=16)
  monkeypatch.setattr("simulator.cache.code_version", lambda: "other")
  assert a != Cache.key(model="tiny", batch=8)
  assert len(code_version()) == 20


def test_put_get_history_and_a_torn_entry(tmp_path):
  cache = Cache(str(tmp_path))
  key = cache.key(x=1)
  assert cache.get("k", key) is None
  cache.put("k", key, {"compile_s": 3.0, "model": "m"})
  cache.put("k", cache.key(x=2), {"compile_s": 5.0, "model": "m"})
  cache.put("k", cache.key(x=3), {"compile_s": 99.0, "model": "other"})
  assert cache.get("k", key) == {"compile_s": 3.0, "model": "m"}
  assert cache.expected("k", "compile_s", model="m") == 4.0
  path = os.path.join(str(tmp_path), "k", key[:2], f"{key}.json")
  with open(path, "w") as f:
    f.write('{"compile_s": ')  # a crash mid-write of an older version
  assert cache.get("k", key) is None
  assert Cache("").get("k", key) is None and Cache(None).history("k", "x") == []


def test_a_repeated_sweep_returns_its_records_from_the_cache(tmp_path):
  spec = search.SweepSpec(model="tiny", topology="v5p-8", batches=(8,),
                          seq=32)
  first = search.Sweep(spec, cache=Cache(str(tmp_path)))
  configs = spec.configs(first.topo)
  records = list(first.evaluate(configs))
  again = search.Sweep(spec, cache=Cache(str(tmp_path)))
  assert list(again.evaluate(configs)) == records
  assert not again._estimators  # nothing traced the second time
  uncached = search.Sweep(spec, cache=Cache(None))
  list(uncached.evaluate(configs))
  assert uncached._estimators


def test_objects_kept_whole_and_a_torn_one(tmp_path):
  cache = Cache(str(tmp_path))
  key = cache.key(x=1)
  assert cache.get_object("g", key, dict) is None
  cache.put_object("g", key, {"a": (1, 2)})
  assert cache.get_object("g", key, dict) == {"a": (1, 2)}
  path = os.path.join(str(tmp_path), "g", key[:2], f"{key}.pickle")
  with open(path, "r+b") as f:
    f.truncate(5)  # a crash mid-write of an older version
  assert cache.get_object("g", key, dict) is None
  assert Cache(None).get_object("g", key, dict) is None
  cache.put_object("g", key, 5)  # not what its reader takes: recomputed
  assert cache.get_object("g", key, dict) is None


def test_an_entry_of_another_shape_is_recomputed(tmp_path):
  cache = Cache(str(tmp_path))
  key = cache.key(x=1)
  cache.put("k", key, {"records": 5})
  assert cache.get("k", key) == {"records": 5}
  assert cache.get("k", key, lambda e: dict(e["records"])) is None


def test_a_folder_that_cannot_be_written_is_said_once(tmp_path, capsys):
  """The cache only saves time: a --cache_dir that is a file (or read-only,
  or on a full disk) is said once and the run goes on without it."""
  blocker = tmp_path / "a-file"
  blocker.write_text("x")
  cache = Cache(str(blocker))
  cache.put("k", cache.key(x=1), {"a": 1})
  cache.put_object("g", cache.key(x=2), {"a": 1})
  err = capsys.readouterr().err
  assert err.count("warning: the cache folder") == 1
  assert str(blocker) in err and "Not a directory" in err
  assert cache.get("k", cache.key(x=1)) is None
  assert blocker.read_text() == "x"


SPEC = search.SweepSpec(model="tiny", topology="v5p-8", batches=(4, 8),
                        remats=("none", "full"), seq=32)


def _plain(records):
  return sorted(({k: v for k, v in r.items() if k != "eval_s"}
                 for r in records), key=search.record_key)


def _swept(spec, directory):
  sweep = search.Sweep(spec, cache=Cache(directory))
  return sweep, _plain(sweep.evaluate(spec.configs(sweep.topo)))


def test_a_sweep_of_other_batches_reads_its_groups_from_the_cache(tmp_path):
  """The traces as data: a sweep whose records are not cached (other
  batches, another --hbm_fraction) reads each group's estimator an earlier
  sweep kept, traces nothing, and makes the records a sweep without a cache
  makes."""
  _swept(SPEC, str(tmp_path))
  for other in (dataclasses.replace(SPEC, batches=(12, 16, 64)),
                dataclasses.replace(SPEC, hbm_fraction=0.5)):
    sweep, records = _swept(other, str(tmp_path))
    assert sweep.traces == 0 and sweep.groups_cached > 0
    assert records == _swept(other, None)[1]


def test_a_cached_group_that_never_walked_a_peak_is_traced_again(tmp_path):
  """A kept estimator that does not know what is live at a batch's peak
  (its live sets dropped here) makes the sweep trace the group again, with
  the same records."""
  _swept(SPEC, str(tmp_path))
  cache = Cache(str(tmp_path))
  paths = glob.glob(os.path.join(str(tmp_path), "groups", "*", "*.pickle"))
  assert paths
  for path in paths:
    key = os.path.basename(path)[:-len(".pickle")]
    est = cache.get_object("groups", key, GroupEstimate)
    est.base_memory.points._live.clear()  # pylint: disable=protected-access
    with open(path, "wb") as f:
      pickle.dump(est, f)
  other = dataclasses.replace(SPEC, hbm_fraction=0.5)
  sweep, records = _swept(other, str(tmp_path))
  assert sweep.traces > 0
  assert records == _swept(other, None)[1]


def test_cache_entries_of_another_shape_are_swept_again(tmp_path):
  """Records and pictures kept in a shape their readers do not take (a
  records entry that is not {batch: record}, one whose record is of
  another batch) are evaluated again, to the same records."""
  _, reference = _swept(SPEC, str(tmp_path))
  paths = glob.glob(os.path.join(str(tmp_path), "records", "*", "*.json"))
  assert paths
  bad = ['{"records": 5}', '{"records": {"4": {}}}', '{"records": [1]}',
         '{"records": {"4": {"X": 4, "Y": 1}}}']
  for i, path in enumerate(paths):
    with open(path, "w") as f:
      f.write(bad[i % len(bad)])
  sweep, records = _swept(SPEC, str(tmp_path))
  assert records == reference and sweep.records_cached == 0


def test_two_sweeps_at_once_keep_both_groups_records(tmp_path):
  """Two sweeps of the same groups at other batches into one cache: the one
  that read the cache before the other kept its records still keeps both."""
  first = dataclasses.replace(SPEC, batches=(4,))
  sweep = search.Sweep(first, cache=Cache(str(tmp_path)))
  configs = first.configs(sweep.topo)
  assert not any(sweep.cached(c) for c in configs)  # read, none there yet
  _swept(dataclasses.replace(SPEC, batches=(8,)), str(tmp_path))
  list(sweep.evaluate(configs))
  again, records = _swept(SPEC, str(tmp_path))
  assert again.records_cached == len(records)
