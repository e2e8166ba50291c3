python -m agent_r1_jax.train --config=configs/grpo_multihopqa.py:qwen2.5-0.5b --config.dry_run=True --config.dry_run_topology=v5e:2x4 --config.dry_run_report=docs/tpu_dry_run/grpo_05b_v5e8_slots.json
