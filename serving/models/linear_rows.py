"""How the T new rows of one forward hang together, as the linear-attention layers need it.

Computed once per forward from the tree mask (shared by every Gated DeltaNet layer):
- `levels`: rows by depth, so a whole depth advances in one batched recurrent step;
- `level_parents`: per depth, the state slot each row starts from (0 = the committed state,
  1 + r = the state after row r);
- `window`: per row, the K conv inputs it reads, oldest first, as indices into
  [committed conv columns (K-1) ; new rows (T)]: its K-1 nearest ancestors, falling back into
  the committed columns near the root, so siblings never mix. None for a causal chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# A causal chain longer than this is a prefill: chunked form, only the final state is kept.
# Shorter chains (decode, DFlash verify) and every tree keep the state after each row.
STEP_ROWS = 32


@dataclass(frozen=True)
class Rows:
    count: int
    stepwise: bool
    levels: list            # per depth: slice or LongTensor of rows
    level_parents: list     # per depth: state slots of those rows' parents
    window: torch.Tensor | None   # LongTensor [T, K] (trees only)

    def state_slots(self, level):
        """State slots the rows of `level` write (slot 1 + r for row r)."""
        if isinstance(level, slice):
            return slice(level.start + 1, level.stop + 1)
        return level + 1

    def conv_window(self, row: int, kernel: int):
        """Indices of the K-1 inputs that become the conv state when `row` is the last committed."""
        if self.window is None:
            return slice(row + 1, row + kernel)
        return self.window[row, 1:]


def plan_rows(count: int, tree_mask: torch.Tensor | None, kernel: int, device) -> Rows:
    if tree_mask is None:
        if count > STEP_ROWS:
            return Rows(count, False, [], [], None)
        levels = [slice(d, d + 1) for d in range(count)]
        return Rows(count, True, levels, levels, None)
    parents = _parents(tree_mask.cpu())
    depth = [0] * count
    for r, p in enumerate(parents):   # parents precede children in row order
        depth[r] = depth[p] + 1 if p >= 0 else 0
    by_depth: list[list[int]] = [[] for _ in range(max(depth) + 1)]
    for r, d in enumerate(depth):
        by_depth[d].append(r)
    levels = [torch.tensor(rows, device=device) for rows in by_depth]
    level_parents = [torch.tensor([parents[r] + 1 for r in rows], device=device) for rows in by_depth]
    return Rows(count, True, levels, level_parents, _windows(parents, kernel).to(device))


def _parents(mask: torch.Tensor) -> list[int]:
    """Nearest visible earlier row per row (its parent), -1 for a root."""
    T = mask.shape[0]
    rows = torch.arange(T)
    earlier = mask & (rows[None, :] < rows[:, None])
    return torch.where(earlier, rows[None, :], -1).max(-1).values.tolist()


def _windows(parents: list[int], kernel: int) -> torch.Tensor:
    """[T, K] conv input indices per row, oldest first (row r is at K-1 + r)."""
    past = kernel - 1
    # predecessor of every input: committed column c -> c - 1; row r -> its parent, or the newest column
    pred = torch.tensor([max(c - 1, 0) for c in range(past)] +
                        [past + p if p >= 0 else past - 1 for p in parents], dtype=torch.long)
    cols = [torch.arange(len(parents)) + past]
    for _ in range(past):
        cols.append(pred[cols[-1]])
    return torch.stack(cols[::-1], dim=1)
