"""The file `specrl_openrlhf.cli.train_ppo_ray` passes to OpenRLHF as `--train.agent_func_path`.

OpenRLHF loads it by path (outside any package), so it holds one absolute import: the class must be named
`AgentExecutor`.
"""

from specrl_openrlhf.integration.openrlhf.agent import SpeculativeAgentExecutor as AgentExecutor  # noqa: F401
