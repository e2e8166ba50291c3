"""The learner: what turns a learner batch into log-probs, values and parameter updates, and how a run builds it.

  updates      the jitted passes: response log-probs and values, the actor and critic updates (`Learner`)
  microbatch   a batch walked m rows at a time (a forward, or a summed gradient equal to the whole batch's)
  optimizer    AdamW with clipping and a warm-up schedule; the update that skips non-finite gradients
  batch_split  a step's rows over processes, mini-batches, micro-batches and the mesh's batch devices
  build        mesh, models, sampler and learner from a config; what a checkpoint must match
  checks       the learner's config sections (`actor.*`, `critic.*`, the loss horizon, chunking)

The warm-up (`warmup`), the sizing of a run (`sizing`) and the RL step loop (`trainer`) build on it; it imports
none of them.
"""
