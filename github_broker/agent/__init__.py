"""The agent side: the SDK (sync `client`, asyncio `aio`), the runner behind `github-broker agent`
with its presets and git workspaces, the MCP server, and the sandbox's demo agent."""
