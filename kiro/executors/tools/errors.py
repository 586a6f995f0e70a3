"""The error every tool raises for what the model should read (kiro.executors.tools.paths raises it too, so it
sits below both)."""


class ToolError(Exception):
    """A refusal or failure the model should read: becomes the result text "error: <message>"."""
