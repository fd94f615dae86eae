"""simulator.cache: results kept by everything that determines them."""

import os

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
