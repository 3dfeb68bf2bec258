"""Pricing engine steps on GPUs: measured step curves, kernel step models, projections; and the running engine's
step time, fitted online. The only place a cost is computed; one module a job:

- `interpolation`: linear between measured points, the one way every price reads its tables;
- `linear`: a step price as the draft budget's linear model (`budget_cost`), one algorithm for every price;
- `curves`: a GPU's measured step curve (`StepCurve`: rows x tokens per row, prefill, the context it was measured at)
  and the engine's host time per step (`HostCurve`); the step-price interface (`StepPrice`) every price keeps;
- `kernels`: a step model from measured vLLM kernels, which prices by context too (`KernelStepModel`);
- `eager`: what an engine without CUDA graphs (`enforce_eager`) adds to a step's kernels (`EagerLaunches`);
- `speculator_kernels`: a GPU speculator's own time a step, by the kernels it launches (vLLM 0.34's suffix
  speculator: an estimate, `kernel_seconds`);
- `prices`: a step price of either kind from its data (`load_price`), at an attention bound (`at_attention`);
- `steps`: engine steps as a run records them (`EngineSteps`) and a rollout's makespan split;
- `projection`: steps priced with every cost (`step_costs`, `RuleCost`) and a rule against stock, the host's part
  shown (`project`: `projected`, `projected_async`, `breakeven_host_ms`, what is missing);
- `rl_scale`: a rule against stock at rows x 1 and at the RL scale, the pair every benchmark prints
  (`project_at_rl_scales`, `scale_fields`);
- `rule_figures`: a rule's figures from simulated steps given as columns (`figures`, `proposer_fit`);
- `measured`: what this machine measured, cached per machine (the proposers' costs, the host curve, `rule_cost`);
- `online`: the running engine's own step time, fitted online (`OnlineStepCost`), the draft budget's cost where no
  GPU price is given.

Core: numpy only; nothing here imports an engine or a layer above the core.
"""
