"""Builds tools by name from config, e.g. `tool.tools=['wiki_search']` with `tool.wiki_search={...}`."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from agent_r1_jax.tools.base import BaseTool
from agent_r1_jax.tools.python_tool import PythonTool
from agent_r1_jax.tools.wiki_search import WikiSearchTool

ToolFactory = Callable[..., BaseTool]
_REGISTRY: dict[str, ToolFactory] = {}


def register_tool(key: str, factory: ToolFactory) -> None:
  """Adds a tool factory (`factory(**options) -> BaseTool`) under a config key."""
  if key in _REGISTRY and _REGISTRY[key] is not factory:
    raise ValueError(f"a tool is already registered under {key!r}")
  _REGISTRY[key] = factory


def registered_tools() -> list[str]:
  return sorted(_REGISTRY)


def build_tool(key: str, options: Mapping[str, Any] | None = None) -> BaseTool:
  """Builds one registered tool with keyword options."""
  if key not in _REGISTRY:
    raise ValueError(f"unknown tool {key!r} in config; registered tools: {registered_tools()}")
  if options is not None and hasattr(options, "to_dict"):  # an ml_collections ConfigDict
    options = options.to_dict()
  return _REGISTRY[key](**dict(options or {}))


def build_tools(keys: Sequence[str], options: Mapping[str, Mapping[str, Any]] | None = None) -> list[BaseTool]:
  """Builds the tools listed in config; `options[key]` holds each tool's keyword options.

  Two tools may not expose the same model-facing name (the environment routes calls by that name).
  """
  if isinstance(keys, str):
    raise ValueError(f"tool.tools must be a list of names, got the string {keys!r}")
  options = options or {}
  tools = [build_tool(k, options.get(k) if k in options else None) for k in keys]
  names = [t.name for t in tools]
  if len(set(names)) != len(names):
    raise ValueError(f"tools expose duplicate names {names}; each tool name must be unique")
  return tools


def _wiki_search(**options: Any) -> BaseTool:
  return WikiSearchTool.from_config(**options)


def _python(**options: Any) -> BaseTool:
  return PythonTool(**options)


register_tool("wiki_search", _wiki_search)
register_tool("python", _python)
