"""Grain pipelines over stored question splits: seeded shuffling, epochs, host sharding, checkpointable state.

  it = example_iterator(source, batch_size=8, seed=0)   # source: ExampleSource or any random-access sequence
  batch = next(it)                                       # list of 8 example dicts
  state = it.get_state()                                 # save with the training checkpoint
  it2 = example_iterator(source, batch_size=8, seed=0); it2.set_state(state)   # resumes exactly

Order: the split is sharded first (`shard_index::shard_count`, so each host of a multi-host run reads its own
rows), then shuffled with `seed` (a fresh permutation each epoch), repeated `num_epochs` times (None = forever),
and grouped into lists of `batch_size` examples.
"""

from __future__ import annotations

from typing import Any, Sequence

import grain


def example_dataset(source: Sequence[Any], *, seed: int = 0, shuffle: bool = True, num_epochs: int | None = None,
                    shard_index: int = 0, shard_count: int = 1) -> grain.MapDataset:
  """A grain `MapDataset` of examples (sharded, shuffled per epoch, repeated)."""
  if shard_count < 1 or not 0 <= shard_index < shard_count:
    raise ValueError(f"need 0 <= shard_index < shard_count, got shard_index={shard_index}, "
                     f"shard_count={shard_count}")
  if len(source) < shard_count:
    raise ValueError(f"the split has {len(source)} examples, fewer than shard_count={shard_count}")
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f"num_epochs must be >= 1 or None (forever), got {num_epochs}")
  ds = grain.MapDataset.source(source)
  if shard_count > 1:
    ds = ds[shard_index::shard_count]
  if shuffle:
    ds = ds.shuffle(seed=seed)
  return ds.repeat(num_epochs)


def example_iterator(source: Sequence[Any], *, batch_size: int, seed: int = 0, shuffle: bool = True,
                     num_epochs: int | None = None, drop_remainder: bool = True, shard_index: int = 0,
                     shard_count: int = 1) -> grain.DatasetIterator:
  """An iterator of batches (lists of example dicts) with `get_state()` / `set_state()`."""
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  ds = example_dataset(source, seed=seed, shuffle=shuffle, num_epochs=num_epochs, shard_index=shard_index,
                       shard_count=shard_count)
  ds = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=list)
  return iter(ds.to_iter_dataset())
