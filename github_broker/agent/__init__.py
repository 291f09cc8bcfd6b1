"""The agent side: an asyncio client, the MCP server, runner presets and git workspaces."""
