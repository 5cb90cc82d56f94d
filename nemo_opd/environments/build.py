"""The run's environments from its config: {task: environment}, the math environment, with
tools around it when env.tools names any (nemo_opd.environments.tool_env)."""

from nemo_opd.config import EnvConfig
from nemo_opd.environments.base import Environment
from nemo_opd.environments.math_env import MathEnvironment
from nemo_opd.environments.tool_env import ToolEnvironment, ToolLimits
from nemo_opd.tools.base import load_tool
from nemo_opd.tools.parsers import PARSERS
from nemo_opd.tools.pool import ToolPool


def build_environments(cfg: EnvConfig, wait: bool = True) -> dict[str, Environment]:
    """The environments by task, their worker processes started (and ready; with wait=False
    the grader workers start in the background: wait_for_environments waits for them)."""
    math = MathEnvironment(cfg.math, wait=wait)
    tools = cfg.tools
    if not tools.names:
        return {"math": math}
    try:
        names = [load_tool(spec).name for spec in tools.names]
        pool = ToolPool(
            tools.names,
            tools.num_workers,
            tools.timeout_s,
            tools.memory_mb,
            tools.max_output_chars,
            turn_budget_s=tools.turn_budget_s,
            step_budget_s=tools.step_budget_s,
            pass_env=tools.pass_env,
        )
    except BaseException:
        math.shutdown()
        raise
    limits = ToolLimits(tools.max_call_chars, tools.max_calls_per_turn)
    return {"math": ToolEnvironment(math, pool, names, PARSERS[tools.format], limits)}


def wait_for_environments(environments: dict[str, Environment]) -> None:
    """Return once the grader workers of environments built with wait=False are ready."""
    for environment in environments.values():
        math = environment.inner if isinstance(environment, ToolEnvironment) else environment
        if isinstance(math, MathEnvironment):
            math.wait_ready()
