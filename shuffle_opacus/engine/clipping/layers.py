"""Per-layer kernels of the fast clipper: squared norms of per-sample gradients and clipped sums.

For ``Linear`` (outer-product identity), ``Conv2d`` (ghost Gram identity, or per-sample gradients
from the unfolded input, a grouped convolution or the input's stride phases) and ``GroupNorm``;
:class:`~shuffle_opacus.engine.clipping.FastGradientClipper` calls them layer by layer.
docs/opacus.md describes the strategies and when each is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

import torch
import torch.nn.functional as F  # noqa: N812
from torch import Tensor, nn

ConvStrategy = Literal["auto", "ghost", "unfold", "grouped", "polyphase"]


@dataclass
class _Record:
    """One hooked layer call of the current forward pass."""

    module: nn.Module
    name: str
    activation: Tensor
    output: Tensor
    version: int


@dataclass
class _LayerWork:
    """Per-layer result of the norm pass, consumed by the clipped-sum pass."""

    record: _Record
    grad_output: Tensor
    # Per-sample gradients kept for the final weighted sum ``c @ G``: param -> (N, numel) in the
    # parameter's layout, or (T, N, numel / T) for a convolution's weight in the tap-major
    # layout of the "polyphase" strategy (reordered by ``_polyphase_to_weight`` after the sum).
    kept: dict[nn.Parameter, Tensor]


def _param(tensor: Tensor) -> nn.Parameter:
    """Type a layer's ``weight`` or ``bias`` as what it is at run time, an ``nn.Parameter``.

    torch annotates these attributes as ``Tensor``; the module registers them as parameters.
    """
    return cast(nn.Parameter, tensor)


def _trainable(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in module.named_parameters(recurse=False) if p.requires_grad]


class LayerKernels:
    """Per-layer computations, a base class of the package's ``FastGradientClipper``."""

    keep_bytes: int
    chunk_bytes: int
    chosen_strategies: dict[str, str]
    _conv_strategy: dict[nn.Module, str]
    _phase_indices: dict[tuple[object, ...], Tensor]
    _workspaces: dict[tuple[object, ...], Tensor]
    _layer_params: dict[nn.Module, list[nn.Parameter]]

    def _workspace(self, m: nn.Module, role: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """Return an uninitialised buffer of ``shape``, reused by later calls for ``(m, role)``.

        The per-sample work of a layer needs the same large buffers at every micro-batch;
        allocating them afresh costs page faults on CPU, because the allocator hands large
        freed blocks back to the system. A buffer grows when a call needs more and lives
        until ``release_workspace``; its contents are dead between calls, so a clipper must
        not run in two threads at once.
        """
        numel = 1
        for d in shape:
            numel *= d
        key = (m, role, like.dtype, like.device)
        buf = self._workspaces.get(key)
        if buf is None or buf.numel() < numel:
            buf = like.new_empty(numel)
            self._workspaces[key] = buf
        return buf[:numel].view(shape)

    def _chunk(self, per_sample_bytes: int, n: int) -> int:
        return max(1, min(n, self.chunk_bytes // max(1, per_sample_bytes)))

    def _layer_sq_norms(self, r: _Record, g: Tensor) -> tuple[Tensor, dict[nn.Parameter, Tensor]]:
        m = r.module
        if isinstance(m, nn.Linear):
            return self._linear_sq_norms(m, r.activation, g)
        if isinstance(m, nn.Conv2d):
            return self._conv_sq_norms(m, r.activation, g, self._resolve_conv_strategy(r, g))
        if isinstance(m, nn.GroupNorm):
            return self._groupnorm_sq_norms(m, r.activation, g)
        raise AssertionError(type(m))  # pragma: no cover - excluded at construction

    def _linear_sq_norms(
        self, m: nn.Linear, a: Tensor, g: Tensor
    ) -> tuple[Tensor, dict[nn.Parameter, Tensor]]:
        n = g.shape[0]
        a = a.to(g.dtype)
        sq = g.new_zeros(n)
        if a.dim() == 2:
            gg = g.square().sum(1)
            if m.weight.requires_grad:
                sq += gg * a.square().sum(1)
            if m.bias is not None and m.bias.requires_grad:
                sq += gg
            return sq, {}
        # Sequence input (N, ..., in): ghost norm over the T token positions or materialise.
        a3, g3 = a.reshape(n, -1, a.shape[-1]), g.reshape(n, -1, g.shape[-1])
        t, din, dout = a3.shape[1], a3.shape[2], g3.shape[2]
        if m.weight.requires_grad:
            if t * t * (din + dout) < t * din * dout:
                step = self._chunk(t * t * g.element_size() * 2, n)
                for s in range(0, n, step):
                    aa = torch.bmm(a3[s : s + step], a3[s : s + step].transpose(1, 2))
                    gg3 = torch.bmm(g3[s : s + step], g3[s : s + step].transpose(1, 2))
                    sq[s : s + step] += (aa * gg3).sum((1, 2))
            else:
                step = self._chunk(din * dout * g.element_size(), n)
                for s in range(0, n, step):
                    ps = torch.bmm(g3[s : s + step].transpose(1, 2), a3[s : s + step])
                    sq[s : s + step] += ps.square().sum((1, 2))
        if m.bias is not None and m.bias.requires_grad:
            sq += g3.sum(1).square().sum(1)
        return sq, {}

    @staticmethod
    def _conv_input(m: nn.Conv2d, a: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Return the conv's input as its kernel sees it, with the padding still to apply."""
        if m.padding_mode != "zeros" or isinstance(m.padding, str):
            mode = "constant" if m.padding_mode == "zeros" else m.padding_mode
            return F.pad(a, m._reversed_padding_repeated_twice, mode=mode), (0, 0)
        return a, (int(m.padding[0]), int(m.padding[1]))

    @staticmethod
    def _conv_dims(m: nn.Conv2d, positions: int) -> tuple[int, int, int]:
        """``(K, O, P)``: per-group patch length, per-group outputs, output positions."""
        k = (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
        return k, m.out_channels // m.groups, positions

    @classmethod
    def heuristic_conv_strategy(cls, m: nn.Conv2d, positions: int) -> str:
        """Return the ``"auto"`` choice for a conv layer with ``positions`` output positions.

        For a strided, ungrouped layer whose kernel is a multiple of its stride,
        ``"polyphase"`` unless the two ``P x P`` Gram matrices of ``"ghost"`` need less than
        half the multiply-adds of the per-sample gradient (``2 P (K + O) < K O``). Otherwise
        ``"ghost"`` when ``P (K + O) < K O`` (late layers, small images); else ``"grouped"``
        (oneDNN grouped convolution) for grouped/depthwise layers and for large outputs with
        long patches (``P >= 100`` and ``K >= 32``), else ``"unfold"``. Measured on an EPYC
        core with ``benchmarks/conv_strategies.py`` (one thread): within 7% of the fastest
        strategy for 11 of its 13 layer shapes, the four layers of the MNIST CNNs among them;
        1.12x for a stride-1 64 -> 128 layer on 8 x 8 (ghost, polyphase fastest) and 1.26x for
        a 3 x 3 stride-2 layer (unfold, grouped fastest).
        """
        k, o, p = cls._conv_dims(m, positions)
        if m.groups == 1 and tuple(m.stride) != (1, 1) and cls._polyphase_taps(m) is not None:
            return "ghost" if 2 * p * (k + o) < k * o else "polyphase"
        if p * (k + o) < k * o:
            return "ghost"
        if m.groups > 1 or (p >= 100 and k >= 32):
            return "grouped"
        return "unfold"

    def _resolve_conv_strategy(self, r: _Record, g: Tensor) -> str:
        m = r.module
        assert isinstance(m, nn.Conv2d)
        strategy = self._conv_strategy[m]
        positions = g.shape[2] * g.shape[3]
        if strategy == "auto":
            strategy = self.heuristic_conv_strategy(m, positions)
        elif strategy == "polyphase" and self._polyphase_taps(m) is None:
            strategy = "unfold"
        self.chosen_strategies[r.name] = strategy
        return strategy

    def _conv_sq_norms(
        self, m: nn.Conv2d, a: Tensor, g: Tensor, strategy: str
    ) -> tuple[Tensor, dict[nn.Parameter, Tensor]]:
        n = g.shape[0]
        a, padding = self._conv_input(m, a.to(g.dtype))
        positions = g.shape[2] * g.shape[3]
        sq = g.new_zeros(n)
        kept: dict[nn.Parameter, Tensor] = {}
        if m.bias is not None and m.bias.requires_grad:
            gb = g.sum((2, 3))
            sq += gb.square().sum(1)
            kept[_param(m.bias)] = gb  # (N, O): always small, reduce with c @ gb
        if not m.weight.requires_grad:
            return sq, kept
        numel = m.weight.numel()
        item = g.element_size()
        if strategy == "ghost":
            k = (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
            per = (positions * (k + m.out_channels // m.groups) + 2 * positions * positions) * item
            step = self._chunk(per * m.groups, n)
            for s in range(0, n, step):
                sq[s : s + step] += self._conv_ghost(m, a[s : s + step], g[s : s + step], padding)
            return sq, kept
        if strategy == "polyphase":
            taps = self._polyphase_store(m, a, g, padding, sq)
            if taps is not None:
                kept[_param(m.weight)] = taps
            return sq, kept
        keep = n * numel * item <= self.keep_bytes
        store = g.new_empty(n, numel) if keep else None
        if strategy == "unfold":
            k = (m.in_channels // m.groups) * m.kernel_size[0] * m.kernel_size[1]
            per = (positions * k + numel) * item
        else:
            per = (a[0].numel() + g[0].numel() + numel) * item
        step = self._chunk(per, n)
        for s in range(0, n, step):
            if strategy == "unfold":
                ps = self._conv_unfold_grads(m, a[s : s + step], g[s : s + step], padding)
            else:
                ps = self._conv_grouped_grads(m, a[s : s + step], g[s : s + step], padding)
            sq[s : s + step] += ps.square().sum((1, 2))
            if store is not None:
                store[s : s + step].view(ps.shape).copy_(ps)
        if store is not None:
            kept[_param(m.weight)] = store
        return sq, kept

    @staticmethod
    def _unfold(m: nn.Conv2d, a: Tensor, padding: tuple[int, int]) -> Tensor:
        """``F.unfold`` of the conv's input: ``(n, C*kh*kw, P)``, channel-major rows.

        Without dilation the patches are taken as a strided view and copied once, which is
        about 30% faster than ``F.unfold``'s ``im2col`` for small images (same values).
        """
        if tuple(m.dilation) != (1, 1):
            return F.unfold(a, m.kernel_size, dilation=m.dilation, padding=padding, stride=m.stride)
        if padding != (0, 0):
            a = F.pad(a, (padding[1], padding[1], padding[0], padding[0]))
        (kh, kw), (sh, sw) = m.kernel_size, m.stride
        v = a.unfold(2, kh, sh).unfold(3, kw, sw)  # (n, C, Ho, Wo, kh, kw), a view
        n, c, ho, wo = v.shape[:4]
        return v.permute(0, 1, 4, 5, 2, 3).reshape(n, c * kh * kw, ho * wo)

    def _conv_ghost(self, m: nn.Conv2d, a: Tensor, g: Tensor, padding: tuple[int, int]) -> Tensor:
        n, groups = a.shape[0], m.groups
        u = self._unfold(m, a, padding)  # (n, Cin*kh*kw, P); channel-major, so groups split
        p = u.shape[-1]
        u = u.reshape(n * groups, -1, p)
        go = g.reshape(n * groups, -1, p)
        aa = torch.bmm(u.transpose(1, 2), u)  # (n*groups, P, P)
        gg = torch.bmm(go.transpose(1, 2), go)
        return (aa * gg).reshape(n, -1).sum(1)

    def _conv_unfold_grads(
        self, m: nn.Conv2d, a: Tensor, g: Tensor, padding: tuple[int, int]
    ) -> Tensor:
        """Per-sample weight gradients ``(n, O, numel / O)`` (maybe a view), by unfold + bmm."""
        n, groups = a.shape[0], m.groups
        u = self._unfold(m, a, padding)
        p = u.shape[-1]
        if groups == 1:
            # (n, K, P) @ (n, P, O) -> (n, K, O): measured faster than (n, O, P) @ (n, P, K);
            # returned as a (n, O, K) view, copied to the weight's layout only if kept.
            return torch.bmm(u, g.reshape(n, -1, p).transpose(1, 2)).transpose(1, 2)
        u = u.reshape(n * groups, -1, p)
        go = g.reshape(n * groups, -1, p)
        return torch.bmm(go, u.transpose(1, 2)).reshape(n, m.out_channels, -1)

    @staticmethod
    def _polyphase_taps(m: nn.Conv2d) -> tuple[int, int] | None:
        """``(Ti, Tj)``, the kernel taps per stride phase, or ``None`` where "polyphase" fails.

        It needs each kernel dimension to be a multiple of its stride, and a dilation only
        along a dimension of stride 1.
        """
        (kh, kw), (sh, sw), (dh, dw) = m.kernel_size, m.stride, m.dilation
        if kh % sh or kw % sw or (dh != 1 and sh != 1) or (dw != 1 and sw != 1):
            return None
        return kh // sh, kw // sw

    @staticmethod
    def _shifted_phases(m: nn.Conv2d, a: Tensor, out_hw: tuple[int, int], tj: int) -> Tensor:
        """View the padded input by stride phase, shifted along the width: ``(n, R, Hp Wo)``.

        Row ``(c, r, q, j)`` (``R = C sh sw Tj``) and column ``(y', x)`` hold the padded input
        at height ``y' sh + r`` and width ``(x + j dw) sw + q``, for ``y' < Hp = Ho + (Ti - 1)
        dh`` and ``x < Wo``. Kernel position ``(i sh + r, j sw + q)`` at output ``(y, x)`` reads
        ``y' = y + i dh``: for the kernel row tap ``i`` the unfolded input is the contiguous
        column range ``[i dh Wo, i dh Wo + Ho Wo)`` of every row. ``Hp / (Ti Ho)`` of the
        unfolded input's size (3,808 instead of 12,544 floats an example for the MNIST CNN's
        first layer, 3,840 instead of 6,400 for its second). ``a`` must be contiguous.
        """
        (sh, sw), (dh, dw) = m.stride, m.dilation
        ho, wo = out_hw
        ti = m.kernel_size[0] // sh
        hp = ho + (ti - 1) * dh
        n, c, _, width = a.shape
        v = a.as_strided(
            (n, c, sh, sw, tj, hp, wo),
            (a.stride(0), a.stride(1), width, 1, dw * sw, sh * width, sw),
        )
        return v.reshape(n, c * sh * sw * tj, hp * wo)

    def _phase_index(
        self,
        m: nn.Conv2d,
        shape: torch.Size,
        out_hw: tuple[int, int],
        tj: int,
        device: torch.device,
    ) -> Tensor:
        """Positions, in one flattened padded example, of its shifted phases by columns.

        Entry ``(g, col, row)`` of the (flattened) result is the position that
        :meth:`_shifted_phases` puts at row ``g R / groups + row``, column ``col``. One
        ``index_select`` with it is 1.6 to 3 times faster on CPU than copying the strided
        view (whose innermost stride is ``sw``), and its columns-by-rows layout is what the
        per-tap products read without a copy. Cached per layer, input shape and device.
        """
        key = (m, tuple(shape), out_hw, device)
        index = self._phase_indices.get(key)
        if index is None:
            positions = torch.arange(shape.numel(), device=device).view(1, *shape)
            rows = self._shifted_phases(m, positions, out_hw, tj)[0]
            index = rows.view(m.groups, -1, rows.shape[1]).transpose(1, 2).reshape(-1)
            self._phase_indices[key] = index
        return index

    def _polyphase_store(
        self, m: nn.Conv2d, a: Tensor, g: Tensor, padding: tuple[int, int], sq: Tensor
    ) -> Tensor | None:
        """Add the weight's per-sample squared norms to ``sq`` by the "polyphase" strategy.

        Per chunk of examples, one gather of the shifted phases (:meth:`_phase_index`) and,
        per kernel row tap ``i``, one batched product of the output gradient ``(O, Ho Wo)``
        with the tap's contiguous column range of them: the per-sample gradient entries of
        kernel rows ``i sh .. i sh + sh - 1``, with no unfolded input and no grouped
        convolution. The buffers are reused from call to call (:meth:`_workspace`).

        Returns:
            The per-sample weight gradients ``(Ti, N, numel / Ti)`` (tap-major, see
            :meth:`_polyphase_to_weight`) when they fit in ``keep_bytes``, else ``None``.
        """
        taps = self._polyphase_taps(m)
        assert taps is not None  # checked by _resolve_conv_strategy
        ti, tj = taps
        n, out_channels, ho, wo = g.shape
        groups, item = m.groups, g.element_size()
        numel = m.weight.numel()
        rows = numel // (out_channels * ti)  # R / groups: (C / groups) sh sw Tj
        hp = ho + (ti - 1) * m.dilation[0]
        per = (groups * rows * hp * wo + out_channels * ho * wo + numel) * item
        step = self._chunk(per, n)
        keep = n * numel * item <= self.keep_bytes
        store = self._workspace(m, "grads", (ti, n if keep else step, numel // ti), g)
        square = self._workspace(m, "square", (step, numel // ti), g)
        og, p = out_channels // groups, ho * wo
        starts = [i * m.dilation[0] * wo for i in range(ti)]
        channels, height, width = a.shape[1:]
        padded = torch.Size((channels, height + 2 * padding[0], width + 2 * padding[1]))
        index = self._phase_index(m, padded, (ho, wo), tj, a.device)
        phases = self._workspace(m, "phases", (step, index.numel()), g)
        for s in range(0, n, step):
            b = min(n, s + step) - s
            x = a[s : s + b]
            if padding != (0, 0):
                x = F.pad(x, (padding[1], padding[1], padding[0], padding[0]))
            else:
                # A fresh copy, read in order, brings the chunk into cache: the gather below
                # then runs three times faster than from the layer's input in main memory.
                x = x.clone(memory_format=torch.contiguous_format)
            w = torch.index_select(x.view(b, -1), 1, index, out=phases[:b])
            w = w.view(b * groups, hp * wo, rows)
            gf = g[s : s + b].reshape(b * groups, og, p)
            part = sq[s : s + b]
            for i, first in enumerate(starts):
                out = store[i, s : s + b] if keep else store[i, :b]
                torch.bmm(gf, w[:, first : first + p], out=out.view(b * groups, og, rows))
                part += torch.mul(out, out, out=square[:b]).sum(1)
        return store if keep else None

    @staticmethod
    def _polyphase_to_weight(m: nn.Conv2d, taps: Tensor) -> Tensor:
        """Reorder a tap-major ``(Ti, numel / Ti)`` sum of "polyphase" gradients.

        The result has the weight's layout ``(O, C / groups, kh, kw)``: tap ``i``'s entry
        ``(o, c, r, q, j)`` is kernel row ``i sh + r``, column ``j sw + q``.
        """
        (kh, kw), (sh, sw) = m.kernel_size, m.stride
        ti, tj = kh // sh, kw // sw
        t = taps.reshape(ti, m.out_channels, m.in_channels // m.groups, sh, sw, tj)
        return t.permute(1, 2, 0, 3, 5, 4).reshape(m.weight.shape)

    def _conv_grouped_grads(
        self, m: nn.Conv2d, a: Tensor, g: Tensor, padding: tuple[int, int]
    ) -> Tensor:
        """Per-sample weight gradients ``(n, O, numel / O)`` by one grouped conv backward."""
        n = a.shape[0]
        # Only the weight's shape matters for the weight gradient; its values are never read.
        w = m.weight.new_empty(n * m.out_channels, *m.weight.shape[1:]).to(g.dtype)
        gw = _conv_weight_grad(
            m,
            g.reshape(1, n * m.out_channels, *g.shape[2:]),
            a.reshape(1, n * m.in_channels, *a.shape[2:]),
            w,
            padding,
            groups=n * m.groups,
        )
        return gw.reshape(n, m.out_channels, -1)

    def _groupnorm_sq_norms(
        self, m: nn.GroupNorm, a: Tensor, g: Tensor
    ) -> tuple[Tensor, dict[nn.Parameter, Tensor]]:
        n = g.shape[0]
        sq = g.new_zeros(n)
        kept: dict[nn.Parameter, Tensor] = {}
        g3 = g.reshape(n, m.num_channels, -1)
        if m.weight is not None and m.weight.requires_grad:
            x_hat = F.group_norm(a.to(g.dtype), m.num_groups, None, None, m.eps)
            gw = (g3 * x_hat.reshape(n, m.num_channels, -1)).sum(2)
            sq += gw.square().sum(1)
            kept[m.weight] = gw
        if m.bias is not None and m.bias.requires_grad:
            gb = g3.sum(2)
            sq += gb.square().sum(1)
            kept[m.bias] = gb
        return sq, kept

    # ------------------------------------------------------------------ clipped sums

    def _layer_clipped(self, w: _LayerWork, c: Tensor) -> dict[nn.Parameter, Tensor]:
        m, a, g = w.record.module, w.record.activation, w.grad_output
        out: dict[nn.Parameter, Tensor] = {}
        for p, ps in w.kept.items():
            summed = c.to(ps.dtype) @ ps
            if ps.dim() == 3:
                assert isinstance(m, nn.Conv2d)
                out[p] = self._polyphase_to_weight(m, summed)
            else:
                out[p] = summed.view_as(p)
        todo = {id(p) for p in self._layer_params[m] if p not in out}
        if not todo:
            return out
        c = c.to(g.dtype)
        if isinstance(m, nn.Linear):
            n = g.shape[0]
            a = a.to(g.dtype)
            gs = g * c.view(n, *([1] * (g.dim() - 1)))
            g2 = gs.reshape(-1, gs.shape[-1])
            if id(m.weight) in todo:
                out[_param(m.weight)] = torch.mm(g2.t(), a.reshape(-1, a.shape[-1]))
            if m.bias is not None and id(m.bias) in todo:
                out[m.bias] = g2.sum(0)
            return out
        if isinstance(m, nn.Conv2d):
            a, padding = self._conv_input(m, a.to(g.dtype))
            gs = g * c.view(-1, 1, 1, 1)
            gw = _conv_weight_grad(m, gs, a, m.weight.to(g.dtype), padding, groups=m.groups)
            out[_param(m.weight)] = gw
            return out
        raise AssertionError(type(m))  # pragma: no cover - GroupNorm always keeps its grads


def _conv_weight_grad(
    m: nn.Conv2d,
    grad_out: Tensor,
    inp: Tensor,
    weight: Tensor,
    padding: tuple[int, int],
    *,
    groups: int,
) -> Tensor:
    """Weight gradient of ``m``'s convolution (stride and dilation of ``m``, explicit padding).

    Only ``weight``'s shape is read; ``groups`` may exceed ``m.groups`` when the reports of a
    batch are folded into channel groups.
    """
    _, gw, _ = torch.ops.aten.convolution_backward(
        grad_out,
        inp,
        weight,
        None,
        list(m.stride),
        list(padding),
        list(m.dilation),
        False,
        [0, 0],
        groups,
        [False, True, False],
    )
    return gw
