"""models.remat: policies by name, checked without jax and built with it."""

import pytest

from models.remat import MAXTEXT_POLICIES, check, policy


@pytest.mark.parametrize("spec", [
    "none", "full", "dots", "names:qkv,mlp_in", "offload:qkv",
    "names:attn_out+offload:decoder_layer_input", *MAXTEXT_POLICIES])
def test_every_valid_spec_checks_and_builds(spec):
  canonical = check(spec)
  built = policy(spec)
  assert (built is None) == (canonical == "none")


@pytest.mark.parametrize("spec,needle", [
    ("sometimes", "unknown remat 'sometimes'"),
    ("names:qkv,nope", "'nope' is not a checkpoint name"),
    ("names:qkv,qkv", "a name given twice"),
    ("offload:qkv+names:qkv", "a combined policy is names:"),
    ("names:qkv+offload:qkv", "both saved and offloaded"),
])
def test_bad_specs_are_one_line_errors_from_check_and_policy(spec, needle):
  for f in (check, policy):
    with pytest.raises(ValueError, match=needle) as e:
      f(spec)
    assert "\n" not in str(e.value)
