"""Tools the policy can call: the base class, the registry, and the search and python tools."""

from agent_r1_jax.tools.base import BaseTool, ToolResult
from agent_r1_jax.tools.python_tool import PythonTool
from agent_r1_jax.tools.registry import build_tool, build_tools, register_tool, registered_tools
from agent_r1_jax.tools.wiki_search import WikiSearchTool, format_hits

__all__ = ["BaseTool", "ToolResult", "PythonTool", "WikiSearchTool", "format_hits", "build_tool", "build_tools",
           "register_tool", "registered_tools"]
