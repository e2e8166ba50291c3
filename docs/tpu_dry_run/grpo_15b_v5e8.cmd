python -m agent_r1_jax.train --config=configs/grpo_multihopqa.py:qwen2.5-1.5b --config.dry_run=True --config.dry_run_topology=v5e:2x4 --config.rollout.max_rows_per_device=30
