"""Two named metrics, as Harbor's multi-metric tasks write them: correctness and documentation."""
import importlib.util
import json
import sys

metrics = {"correctness": 0, "documentation": 0}
try:
    spec = importlib.util.spec_from_file_location("area", "/app/area.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    metrics["correctness"] = int(module.area(3, 4) == 12 and module.area(0, 5) == 0)
    metrics["documentation"] = int(bool((module.area.__doc__ or "").strip()))
except Exception as exc:  # a missing or broken module scores 0 on both
    print("not importable:", exc, file=sys.stderr)
print(json.dumps(metrics))
