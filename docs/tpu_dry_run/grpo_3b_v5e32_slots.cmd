python -m agent_r1_jax.train --config=configs/grpo_multihopqa.py:qwen2.5-3b --config.dry_run=True --config.dry_run_topology=v5e:4x8 --config.dry_run_report=docs/tpu_dry_run/grpo_3b_v5e32_slots.json
