"""seedlab's ensemble AdamW is torch.optim.AdamW, per member, step for step."""

import torch

from seedlab.shortcut.config import ModelConfig
from seedlab.shortcut.model import EnsembleTransformer
from seedlab.shortcut.optim import EnsembleAdamW


def test_matches_torch_adamw_step_for_step():
    torch.manual_seed(0)
    hp = dict(lr=[1e-3, 3e-2, 5e-3], weight_decay=[0.1, 0.4, 0.0], beta1=[0.9, 0.8, 0.9], beta2=[0.999, 0.99, 0.98], eps=[1e-8, 1e-6, 1e-8])
    model = EnsembleTransformer(ModelConfig(layers=2, heads=2), 3, 10, 5, 2)
    model.init_members([0, 1, 2])
    ours = EnsembleAdamW(model.parameters(), **hp)
    params = list(model.parameters())
    # torch's AdamW on an independent copy of each member's tensors
    copies, refs = [], []
    for i in range(3):
        leaves = [p[i].detach().clone().requires_grad_() for p in params]
        copies.append(leaves)
        refs.append(
            torch.optim.AdamW(
                leaves, lr=hp["lr"][i], weight_decay=hp["weight_decay"][i], betas=(hp["beta1"][i], hp["beta2"][i]), eps=hp["eps"][i]
            )
        )
    for step in range(25):
        x, y = torch.randint(0, 10, (3, 64, 5)), torch.randint(0, 2, (3, 64))
        ours.zero_grad()
        loss, _ = model.losses(x, y)
        loss.sum().backward()
        for i in range(3):
            for leaf, p in zip(copies[i], params):
                leaf.grad = p.grad[i].clone()
            refs[i].step()
        ours.step()
        for i in range(3):
            for leaf, p in zip(copies[i], params):
                assert torch.equal(p[i].detach(), leaf.detach()), f"member {i} differs at step {step + 1}"
