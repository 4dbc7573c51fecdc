"""A seed-vectorized transformer classifier: S members in one set of tensors.

Every parameter has a leading member axis ``S``; member ``i`` is the slice ``[i]``.
The math of one member is a plain pre-LN transformer encoder with a readout token:

    tokens   = x_1 .. x_L, [READ]                      (READ = vocab, a dedicated token)
    resid    = W_E[tokens] + W_pos                      hook_embed, hook_pos_embed
    for each block l:                                   blocks.l.hook_resid_pre
        h        = LN1(resid)                           blocks.l.ln1.hook_normalized
        q, k, v  = h W_Q + b_Q, h W_K + b_K, h W_V + b_V  blocks.l.attn.hook_q/k/v
        pattern  = softmax(q k^T / sqrt(d_head))        blocks.l.attn.hook_attn_scores/hook_pattern
        z        = pattern v                            blocks.l.attn.hook_z
        resid    = resid + z W_O + b_O                  blocks.l.hook_attn_out, hook_resid_mid
        resid    = resid + MLP(LN2(resid))              blocks.l.ln2.hook_normalized,
                                                        blocks.l.mlp.hook_pre/hook_post, hook_mlp_out
                                                        blocks.l.hook_resid_post
    logits   = LN_final(resid[READ]) W_U + b_U          ln_final.hook_normalized

Hook names and weight shapes follow TransformerLens (W_Q: [heads, d_model, d_head],
W_O: [heads, d_head, d_model], ...), with the member axis in front of everything:
activations are [S, batch, pos, ...]. Each name is a :class:`~seedlab.hooks.HookPoint`
module at that path, so ``hook_names``, ``hooks``, ``run_with_hooks`` and
``run_with_cache`` come from :class:`~seedlab.hooks.HookedModule`. Computed only when a
hook asks for them: ``blocks.l.attn.hook_result`` (per-head outputs, [S, batch, pos,
head, d_model]) and the attention scores and pattern in TransformerLens's layout. The
``hook_normalized`` points fire only when the config has layer norms.

Why our own module instead of ``torch.func.vmap`` over S ``nn.Module`` copies: the
ensemble is the hot path of every sweep; writing the batched matmuls directly makes
each projection of all S members one ``baddbmm`` and lets us skip dead work (below),
and keeps every weight addressable by name for the circuit analyses.

When no hook is registered, the last block computes queries, the attention output
and the MLP at the readout position only: the logits read nothing else, so this is
the same function with less work. With any hook registered, every position is computed.

Training in bf16 runs :meth:`~EnsembleTransformer.forward_folded` instead: the same function
(no hooks) with each layer norm's gain and bias folded into the projection that reads it and
1/sqrt(d_head) folded into W_Q (:meth:`~EnsembleTransformer.folded_weights`), its matmul weights
cast to bfloat16 once per optimizer step by the caller, and its attention mask in bfloat16, so
no per-activation affine, scale, mask promotion or weight cast is left in the step
(docs/benchmarks.md). The fp32 forward is untouched by it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seedlab.errors import SeedlabError
from seedlab.hooks import HookedModule, HookPoint
from seedlab.shortcut.config import ModelConfig


def _p(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape))


class _LN(nn.Module):
    def __init__(self, S: int, d: int):
        super().__init__()
        self.w, self.b = _p(S, d), _p(S, d)
        self.hook_normalized = HookPoint()


class _Attn(nn.Module):
    def __init__(self, S: int, H: int, d: int, dh: int):
        super().__init__()
        self.W_Q, self.W_K, self.W_V = _p(S, H, d, dh), _p(S, H, d, dh), _p(S, H, d, dh)
        self.b_Q, self.b_K, self.b_V = _p(S, H, dh), _p(S, H, dh), _p(S, H, dh)
        self.W_O, self.b_O = _p(S, H, dh, d), _p(S, d)
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_attn_scores, self.hook_pattern = HookPoint(), HookPoint()  # [S, B, head, q_pos, k_pos]
        self.hook_z = HookPoint()  # [S, B, pos, head, d_head]
        self.hook_result = HookPoint()  # [S, B, pos, head, d_model]: per-head writes into the residual stream


class _MLP(nn.Module):
    def __init__(self, S: int, d: int, f: int):
        super().__init__()
        self.W_in, self.b_in = _p(S, d, f), _p(S, f)
        self.W_out, self.b_out = _p(S, f, d), _p(S, d)
        self.hook_pre, self.hook_post = HookPoint(), HookPoint()


class _Block(nn.Module):
    def __init__(self, S: int, cfg: ModelConfig):
        super().__init__()
        d, H = cfg.d_model, cfg.heads
        self.ln1, self.ln2 = _LN(S, d), _LN(S, d)
        self.attn = _Attn(S, H, d, d // H)
        self.mlp = _MLP(S, d, cfg.d_ff)
        self.hook_resid_pre, self.hook_attn_out, self.hook_resid_mid = HookPoint(), HookPoint(), HookPoint()
        self.hook_mlp_out, self.hook_resid_post = HookPoint(), HookPoint()


class _Embed(nn.Module):
    def __init__(self, S: int, n: int, d: int):
        super().__init__()
        self.W_E = _p(S, n, d)


class _PosEmbed(nn.Module):
    def __init__(self, S: int, n: int, d: int):
        super().__init__()
        self.W_pos = _p(S, n, d)


class _Unembed(nn.Module):
    def __init__(self, S: int, d: int, c: int):
        super().__init__()
        self.W_U, self.b_U = _p(S, d, c), _p(S, c)


def _per_member(t: Tensor, like: Tensor) -> Tensor:
    """Reshape an [S, ...] parameter slice so it broadcasts over ``like``'s batch dims."""
    return t.view(t.shape[0], *([1] * (like.dim() - t.dim())), *t.shape[1:])


class EnsembleTransformer(HookedModule):
    def __init__(self, cfg: ModelConfig, n_members: int, vocab: int, length: int, n_classes: int):
        super().__init__()
        S, d = n_members, cfg.d_model
        self.cfg, self.S, self.vocab, self.length, self.n_classes = cfg, S, vocab, length, n_classes
        self.embed = _Embed(S, vocab + 1, d)  # +1: the readout token
        self.pos_embed = _PosEmbed(S, length + 1, d)
        self.hook_embed = HookPoint()  # [S, B, pos, d_model]
        self.hook_pos_embed = HookPoint()  # [S, 1, pos, d_model]: the same for every sequence
        self.blocks = nn.ModuleList(_Block(S, cfg) for _ in range(cfg.layers))
        self.ln_final = _LN(S, d)
        self.unembed = _Unembed(S, d, n_classes)
        self._masks: dict[tuple, Tensor] = {}
        self.init_members([0] * S)

    # ---------------------------------------------------------------- init
    @torch.no_grad()
    def init_members(self, seeds: Sequence[int]) -> None:
        """Initialize member i from its own generator seeded with ``seeds[i]``.

        A member's initial weights depend only on its seed, never on its ensemble.
        """
        assert len(seeds) == self.S
        for i, seed in enumerate(seeds):
            g = torch.Generator().manual_seed(int(seed))
            for name, p in self.named_parameters():  # fixed order
                leaf = name.rsplit(".", 1)[-1]
                if leaf.startswith("W_"):
                    p[i].copy_(torch.randn(p.shape[1:], generator=g) * self.cfg.init_std)
                elif leaf == "w":
                    p[i].fill_(1.0)
                else:
                    p[i].zero_()

    # ---------------------------------------------------------------- forward
    def _ln(self, x: Tensor, ln: _LN) -> Tensor:
        if not self.cfg.layer_norm:
            return x
        return ln.hook_normalized(F.layer_norm(x, x.shape[-1:]) * _per_member(ln.w, x) + _per_member(ln.b, x))

    def _mm(self, x: Tensor, W: Tensor, b: Tensor) -> Tensor:
        """[S, *, i] @ [S, i, o] + [S, o] as one batched matmul per member axis."""
        S = x.shape[0]
        out = torch.baddbmm(b.unsqueeze(1), x.reshape(S, -1, x.shape[-1]), W)
        return out.view(*x.shape[:-1], W.shape[-1])

    def _attention(self, a: _Attn, h: Tensor, readout_only: bool) -> Tensor:
        S, B, P, d = h.shape
        H, dh = a.W_Q.shape[1], a.W_Q.shape[3]
        flat = lambda W: W.permute(0, 2, 1, 3).reshape(S, d, H * dh)  # [S,H,d,dh] -> [S,d,H*dh]
        # three separate projections: each output is contiguous, so the reshapes below are free
        proj = lambda t, W, b: self._mm(t, flat(W), b.reshape(S, -1)).view(*t.shape[:-1], H, dh)
        q = proj(h[:, :, -1:] if readout_only else h, a.W_Q, a.b_Q)  # readout: one query per sequence
        k, v = proj(h, a.W_K, a.b_K), proj(h, a.W_V, a.b_V)
        q, k, v = a.hook_q(q), a.hook_k(k), a.hook_v(v)
        # Sequences are a handful of tokens long, and per-head (pos x pos) matmuls on transposed
        # views fall off the batched-GEMM path on CPU. So one matmul per sequence scores every
        # query row (pos, head) against every key row (pos, head) in the native [pos, head, d_head]
        # layout; a mask of -inf off the head diagonal (and above it, if causal) makes the row
        # softmax the per-head softmax, giving a block-diagonal pattern A that multiplies V
        # directly. H x the flops of per-head products, negligible next to the projections.
        P, Pq = k.shape[2], q.shape[2]
        SB = S * B
        cross = torch.bmm(q.reshape(SB, Pq * H, dh), k.reshape(SB, P * H, dh).transpose(1, 2))
        cross = cross / math.sqrt(dh) + self._mask(Pq, P, H, k.device)
        if a.hook_attn_scores.fns or a.hook_pattern.fns:
            # TransformerLens's layout [S, B, H, q_pos, k_pos]; a hook may replace either
            diag = cross.view(S, B, Pq, H, P, H).diagonal(dim1=3, dim2=5)  # [S, B, q_pos, k_pos, H]
            scores = a.hook_attn_scores(diag.permute(0, 1, 4, 2, 3))
            pattern = a.hook_pattern(scores.softmax(-1))
            eye = torch.eye(H, dtype=pattern.dtype, device=pattern.device)
            A = torch.einsum("sbhij,hg->sbihjg", pattern, eye).reshape(SB, Pq * H, P * H)
        else:
            A = cross.softmax(-1)
        z = a.hook_z(torch.bmm(A, v.reshape(SB, P * H, dh)).view(S, B, Pq, H, dh))
        if a.hook_result.fns:  # per-head writes into the residual stream
            result = a.hook_result(torch.einsum("sbphe,shed->sbphd", z, a.W_O))
            return result.sum(-2) + _per_member(a.b_O, result[..., 0, :])
        return self._mm(z.flatten(-2), a.W_O.reshape(S, H * dh, d), a.b_O)

    def _mask(self, Pq: int, P: int, H: int, device: torch.device, dtype: torch.dtype = torch.float32) -> Tensor:
        """[Pq*H, P*H] additive mask: 0 where query row (i, h) may see key row (j, g), else -inf.

        Rows see their own head only; with ``causal``, key positions up to their own. The Pq
        queries are the last Pq positions (all of them, or the readout token alone).
        """
        key = (Pq, P, H, str(device), dtype)
        if key not in self._masks:
            i = torch.arange(P - Pq, P).view(Pq, 1, 1, 1)
            j = torch.arange(P).view(1, 1, P, 1)
            h, g = torch.arange(H).view(1, H, 1, 1), torch.arange(H).view(1, 1, 1, H)
            ok = (h == g) & ((j <= i) | (not self.cfg.causal))
            mask = torch.zeros(ok.shape).masked_fill(~ok, float("-inf")).reshape(Pq * H, P * H)
            self._masks[key] = mask.to(device=device, dtype=dtype)
        return self._masks[key]

    def _mlp(self, m: _MLP, h: Tensor) -> Tensor:
        act = F.relu if self.cfg.act == "relu" else F.gelu
        post = m.hook_post(act(m.hook_pre(self._mm(h, m.W_in, m.b_in))))
        return self._mm(post, m.W_out, m.b_out)

    def forward(self, x: Tensor) -> Tensor:
        """x: [S, B, length] integers in 0..vocab-1 -> logits [S, B, n_classes]."""
        S, B, L = x.shape
        V = self.vocab + 1
        tokens = torch.cat([x, x.new_full((S, B, 1), self.vocab)], -1)  # append the readout token
        offsets = torch.arange(S, device=x.device).view(S, 1, 1) * V  # member i reads its own W_E
        embed = self.hook_embed(F.embedding(tokens + offsets, self.embed.W_E.reshape(S * V, -1)))
        pos = self.hook_pos_embed(self.pos_embed.W_pos[:, None, : L + 1])
        resid = embed + pos
        n = self.cfg.layers
        for l, blk in enumerate(self.blocks):
            last_only = l == n - 1 and not self.n_hooks
            resid = blk.hook_resid_pre(resid)
            attn_out = blk.hook_attn_out(self._attention(blk.attn, self._ln(resid, blk.ln1), last_only))
            resid = blk.hook_resid_mid((resid[:, :, -1:] if last_only else resid) + attn_out)
            mlp_out = blk.hook_mlp_out(self._mlp(blk.mlp, self._ln(resid, blk.ln2)))
            resid = blk.hook_resid_post(resid + mlp_out)
        final = self._ln(resid[:, :, -1], self.ln_final)  # the readout token
        return self._mm(final, self.unembed.W_U, self.unembed.b_U)

    # ---------------------------------------------------------------- the folded (bf16) training forward
    def folded_weights(self) -> dict[str, Tensor]:
        """The weights :meth:`forward_folded` reads, computed from the parameters (with their graph), in fp32.

        Each layer norm's gain w and bias b are folded into the projection that reads it,
        (x̂ ⊙ w + b) W + c = x̂ (w ⊙ W) + (b W + c), and 1/sqrt(d_head) into W_Q and b_Q. Keys:
        "embed" ([S, vocab+1, d]), "pos" ([S, length+1, d]), then "blocks.{l}.{q,k,v,o,in,out}.{W,b}"
        and "unembed.{W,b}", each W as [S, in, out] (heads flattened in TransformerLens order), each b as [S, out].
        """
        S, out = self.S, {"embed": self.embed.W_E, "pos": self.pos_embed.W_pos}

        def put(key: str, W: Tensor, b: Tensor, ln: _LN | None, scale: float = 1.0) -> None:
            if ln is not None and self.cfg.layer_norm:
                W, b = ln.w.unsqueeze(-1) * W, b + torch.bmm(ln.b.unsqueeze(1), W).squeeze(1)
            out[f"{key}.W"], out[f"{key}.b"] = (W * scale, b * scale) if scale != 1.0 else (W, b)

        for l, blk in enumerate(self.blocks):
            a, key = blk.attn, f"blocks.{l}"
            H, d, dh = a.W_Q.shape[1:]
            flat = lambda W: W.permute(0, 2, 1, 3).reshape(S, d, H * dh)  # noqa: B023 -- [S,H,d,dh] -> [S,d,H*dh]
            put(f"{key}.q", flat(a.W_Q), a.b_Q.reshape(S, -1), blk.ln1, 1 / math.sqrt(dh))
            put(f"{key}.k", flat(a.W_K), a.b_K.reshape(S, -1), blk.ln1)
            put(f"{key}.v", flat(a.W_V), a.b_V.reshape(S, -1), blk.ln1)
            put(f"{key}.o", a.W_O.reshape(S, H * dh, d), a.b_O, None)
            put(f"{key}.in", blk.mlp.W_in, blk.mlp.b_in, blk.ln2)
            put(f"{key}.out", blk.mlp.W_out, blk.mlp.b_out, None)
        put("unembed", self.unembed.W_U, self.unembed.b_U, self.ln_final)
        return out

    def forward_folded(self, x: Tensor, w: dict[str, Tensor]) -> Tensor:
        """The forward without hooks, on :meth:`folded_weights` ``w`` (its matmul weights cast, e.g. to bf16):
        x [S, B, length] -> logits [S, B, n_classes] in the matmul weights' dtype.

        The residual stream stays in the embeddings' dtype (fp32) and each layer norm (without its
        affine, folded into ``w``) runs on it; the matmuls, softmax and MLP run in the weights' dtype.
        The same function as :meth:`forward`, rounded differently; the last block works at the readout only.
        """
        if self.n_hooks:
            raise SeedlabError("forward_folded runs without hooks: use the model's forward to hook it")
        S, B, L = x.shape
        V, dt, n = self.vocab + 1, w["unembed.W"].dtype, self.cfg.layers
        norm = (lambda t: F.layer_norm(t, t.shape[-1:]).to(dt)) if self.cfg.layer_norm else (lambda t: t.to(dt))
        act = F.relu if self.cfg.act == "relu" else F.gelu
        tokens = torch.cat([x, x.new_full((S, B, 1), self.vocab)], -1)
        offsets = torch.arange(S, device=x.device).view(S, 1, 1) * V
        resid = F.embedding(tokens + offsets, w["embed"].reshape(S * V, -1)) + w["pos"][:, None, : L + 1]
        for l, blk in enumerate(self.blocks):
            key, last_only = f"blocks.{l}", l == n - 1
            H = blk.attn.W_Q.shape[1]
            h = norm(resid)
            q = self._mm(h[:, :, -1:] if last_only else h, w[f"{key}.q.W"], w[f"{key}.q.b"])
            k, v = self._mm(h, w[f"{key}.k.W"], w[f"{key}.k.b"]), self._mm(h, w[f"{key}.v.W"], w[f"{key}.v.b"])
            P, Pq, dh = k.shape[2], q.shape[2], k.shape[-1] // H
            # the block-diagonal attention of _attention, scale already in W_Q, mask in the compute dtype
            cross = torch.bmm(q.reshape(S * B, Pq * H, dh), k.reshape(S * B, P * H, dh).transpose(1, 2))
            A = (cross + self._mask(Pq, P, H, x.device, dt)).softmax(-1)
            z = torch.bmm(A, v.reshape(S * B, P * H, dh)).view(S, B, Pq, H * dh)
            resid = (resid[:, :, -1:] if last_only else resid) + self._mm(z, w[f"{key}.o.W"], w[f"{key}.o.b"])
            mlp = self._mm(act(self._mm(norm(resid), w[f"{key}.in.W"], w[f"{key}.in.b"])), w[f"{key}.out.W"], w[f"{key}.out.b"])
            resid = resid + mlp
        return self._mm(norm(resid[:, :, -1]), w["unembed.W"], w["unembed.b"])

    # ---------------------------------------------------------------- losses
    def losses(self, x: Tensor, y: Tensor, folded: dict[str, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """Per-member summed cross-entropy and number correct: two [S] tensors (``folded``: :meth:`row_losses`)."""
        ce, correct = self.row_losses(x, y, folded)
        return ce.sum(1), correct.sum(1)

    def row_losses(self, x: Tensor, y: Tensor, folded: dict[str, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        """Per-row cross-entropy and whether the row is classified correctly: two [S, B] tensors.
        With ``folded`` weights, through :meth:`forward_folded`. The loss is fp32 even when the
        forward runs in bf16 (folded weights in bf16, or autocast)."""
        logits = (self(x) if folded is None else self.forward_folded(x, folded)).float()
        S, B, C = logits.shape
        ce = F.cross_entropy(logits.reshape(S * B, C), y.reshape(S * B), reduction="none").view(S, B)
        return ce, logits.argmax(-1) == y

    # ---------------------------------------------------------------- members
    def member_state(self, i: int) -> dict[str, Tensor]:
        """Member i's weights as a plain state dict (TransformerLens-style names, no member axis)."""
        return {k: v[i].detach().clone() for k, v in self.state_dict().items()}

    @torch.no_grad()
    def load_member(self, i: int, state: dict[str, Tensor]) -> None:
        for k, v in self.state_dict().items():
            v[i].copy_(state[k])
