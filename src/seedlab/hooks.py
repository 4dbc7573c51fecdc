"""Named hook points, TransformerLens-style, shared by both studies' models.

A :class:`HookPoint` is an identity module placed on an activation in ``forward``::

    q = self.hook_q(q)       # returns q, or what a registered hook returns instead

Its name is its path in the model (``blocks.0.attn.hook_q``), so a model's hook names
are found by walking its modules (:meth:`HookedModule.hook_names`), never kept in a
list by hand. A hook is ``fn(act, name)``: it may read ``act`` (return None) or return
a replacement, which the forward pass then uses. :class:`HookedModule` registers hooks
for the length of a ``with model.hooks([(name, fn), ...]):`` block and gives
``run_with_hooks`` and ``run_with_cache`` on top of it.

Why our own and not ``transformer_lens.hook_points``: TransformerLens is an optional
extra (``seedlab[lens]``, for exporting a member), and the models train without it.
The idea and the names are TransformerLens's; the mechanics are these ~60 lines.

HookPoints hold no parameters or buffers: adding one changes neither a model's state
dict nor the order of ``named_parameters()``, so weights and initializations are the
same with and without them. With no hook registered a HookPoint returns its input
itself (no copy), so results are bitwise the same as without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn

Hook = Callable[[Tensor, str], Tensor | None]


class HookPoint(nn.Module):
    """Identity on one activation; runs the hooks registered on it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""  # its path in the model, set when the model is walked
        self.fns: list[Hook] = []

    def forward(self, x: Tensor) -> Tensor:
        for fn in self.fns:
            out = fn(x, self.name)
            if out is not None:
                x = out
        return x

    # Called directly, not through nn.Module.__call__ (whose module-hook bookkeeping would
    # cost a few microseconds on each of the dozens of hook points a training step passes).
    __call__ = forward


class HookedModule(nn.Module):
    """A model whose hook points are its :class:`HookPoint` submodules."""

    def __init__(self) -> None:
        super().__init__()
        self.n_hooks = 0  # hooks registered now; models may skip work no hook can see when 0

    def hook_points(self) -> dict[str, HookPoint]:
        """Every HookPoint by name (its path in the model), in module order."""
        points = {name: m for name, m in self.named_modules() if isinstance(m, HookPoint)}
        for name, point in points.items():
            point.name = name
        return points

    @property
    def hook_names(self) -> list[str]:
        return list(self.hook_points())

    @contextmanager
    def hooks(self, fwd_hooks: Sequence[tuple[str, Hook]]) -> Iterator[None]:
        """Register ``(name, fn)`` pairs for the block; ``fn(act, name)`` may return a replacement.

        An unknown name raises KeyError before anything is registered."""
        points = self.hook_points()
        for name, _ in fwd_hooks:
            if name not in points:
                raise KeyError(f"unknown hook point {name!r}")
        saved = {name: points[name].fns for name, _ in fwd_hooks}
        for name, fn in fwd_hooks:
            points[name].fns = [*points[name].fns, fn]
        self.n_hooks += len(fwd_hooks)
        try:
            yield
        finally:
            for name, fns in saved.items():
                points[name].fns = fns
            self.n_hooks -= len(fwd_hooks)

    def run_with_hooks(self, x: Tensor, fwd_hooks: Sequence[tuple[str, Hook]], **kwargs: Any) -> Any:
        """``self(x, **kwargs)`` with ``fwd_hooks`` registered."""
        with self.hooks(fwd_hooks):
            return self(x, **kwargs)

    def run_with_cache(
        self, x: Tensor, names: Sequence[str] | None = None, **kwargs: Any
    ) -> tuple[Any, dict[str, Tensor]]:
        """``(self(x, **kwargs), {name: activation})`` for ``names`` (default: every hook point).

        Activations are detached. A hook point the forward pass does not reach (e.g. a
        layer norm the config turns off) has no entry."""
        cache: dict[str, Tensor] = {}

        def save(t: Tensor, name: str) -> None:
            cache[name] = t.detach()

        out = self.run_with_hooks(x, [(n, save) for n in (names or self.hook_names)], **kwargs)
        return out, cache
