"""Every rank fails the same way: a deterministic user bug."""
import os

print(f"rank {os.environ['RANK']} step 0 loss 2.0", flush=True)
batch = {"input_ids": [1, 2, 3]}
print(batch["labels"])
