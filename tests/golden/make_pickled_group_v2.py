"""Write tests/golden/pickled_group_v2.pickle: one group as the v2 group format pickles it (storages saved once,
tensors as views of them, NumPy views of their base, optimizers through state_dict, locks).

    PYTHONPATH=. .venv/bin/python tests/golden/make_pickled_group_v2.py tests/golden/pickled_group_v2.pickle
"""
import pickle
import sys
import threading

import numpy as np
import torch

from spotwarp_jupyter.engine import pickling

torch.manual_seed(3)
base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
conv = torch.nn.Conv2d(2, 3, 3).to(memory_format=torch.channels_last)
opt = torch.optim.Adam(conv.parameters(), lr=0.01)
conv(torch.ones(1, 2, 5, 5).to(memory_format=torch.channels_last)).sum().backward()
opt.step()
flagged = torch.nn.Parameter(torch.ones(3))
flagged.no_decay = True
arr = np.arange(12, dtype=np.int32).reshape(3, 4)
held = threading.Lock()
held.acquire()
group = {"base": base, "row": base[1], "tr": base.t(), "conv": conv, "opt": opt, "flagged": flagged,
         "arr": arr, "arr_view": arr[1:, ::2], "held": held,
         "sparse": torch.sparse_coo_tensor(torch.tensor([[0, 0, 2]]), torch.tensor([1.0, 2.0, 5.0]), (3,))}
pickled = pickling.dumps(group)
with open(sys.argv[1], "wb") as out:
    pickle.dump({"codec": pickled.codec, "data": pickled.data, "buffers": [bytes(b) for b in pickled.buffers],
                 "conv_out": conv(torch.ones(1, 2, 5, 5)).detach().flatten().tolist()}, out)
