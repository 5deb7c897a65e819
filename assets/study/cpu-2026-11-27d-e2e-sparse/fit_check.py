"""How close the shipped 3x policy stays to the task model on MRs it TRAINED on (the distillation
targets' own MRs) against held-out ones: underfitting (capacity) or not generalising."""
import json, sys
from pathlib import Path
import torch
from model.tasks.task_training import TaskRun, train_config, _descriptions
from model.tasks.task_eval import closeness
from model.tasks.e2e import added_attributes
torch.set_num_threads(2)
adapter = Path(sys.argv[1]); rows_file = sys.argv[2]
pre = "meaning representation: "
rows = [json.loads(l) for l in open(rows_file)]
mrs = [r["prompt"].split(pre, 1)[1] for r in rows]
picked = {"training devset MRs": mrs[:100], "synthetic MRs (0.75)": mrs[497:597]}
run = TaskRun(policy="3"); config = train_config(run, Path("unused"))
for name, group in picked.items():
    out = _descriptions(run, config, adapter, group, (1.0, 3.0))
    made = sum(bool(set(added_attributes(m, b)) - set(added_attributes(m, a))) for m, a, b in zip(group, out[1.0], out[3.0]))
    print(json.dumps({"adapter": str(adapter), "set": name, "mrs": len(group), **closeness(out[3.0], out[1.0]),
                      "beyond_task_model": made / len(group)}), flush=True)
