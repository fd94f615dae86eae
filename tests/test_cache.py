"""simulator.cache: results kept by everything that determines them."""

import dataclasses
import glob
import os
import pickle

from simulator import search
from simulator.cache import Cache, code_version


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
  assert cache.get_object("g", key) is None
  cache.put_object("g", key, {"a": (1, 2)})
  assert cache.get_object("g", key) == {"a": (1, 2)}
  path = os.path.join(str(tmp_path), "g", key[:2], f"{key}.pickle")
  with open(path, "r+b") as f:
    f.truncate(5)  # a crash mid-write of an older version
  assert cache.get_object("g", key) is None
  assert Cache(None).get_object("g", key) is None


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
    est = cache.get_object("groups", key)
    est.base_memory.points._live.clear()  # pylint: disable=protected-access
    with open(path, "wb") as f:
      pickle.dump(est, f)
  other = dataclasses.replace(SPEC, hbm_fraction=0.5)
  sweep, records = _swept(other, str(tmp_path))
  assert sweep.traces > 0
  assert records == _swept(other, None)[1]
