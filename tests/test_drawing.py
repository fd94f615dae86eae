"""experiments.drawing: the drawings, and the request/reply loop the
painter processes run."""

import base64
import io
import json

from PIL import Image

from experiments import drawing


def test_each_request_gets_one_reply_in_order():
  """A PNG for a drawing it knows, an error line (not an exit) for one it
  does not, and the next request still answered."""
  heatmap = {"meshes": ["2x4", "4x2"], "batches": [8, 16],
             "mfu": [[0.4, None], [0.5, 0.6]], "fits": [[True, False],
                                                        [True, True]]}
  requests = io.StringIO("".join(json.dumps(r) + "\n" for r in (
      {"picture": "heatmap", "data": heatmap},
      {"picture": "pie", "data": {}},
      {"picture": "breakdown", "data": {"labels": ["2x4 b8\nfull"],
                                        "stacks": {"params": [3.0]},
                                        "hbm_gib": 95.0}})))
  replies = io.StringIO()
  drawing.serve(requests, replies)
  first, second, third = map(json.loads, replies.getvalue().splitlines())
  assert Image.open(io.BytesIO(base64.b64decode(first["png"]))).size[1] > 200
  assert second == {"error": "KeyError: 'pie'"}
  assert base64.b64decode(third["png"]).startswith(b"\x89PNG")
