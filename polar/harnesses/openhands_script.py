"""Runs OpenHands headless, one shot: its SDK's default agent (CLI preset: terminal, file editor, task tracker)
on the task given as argv[1], in the current directory. The endpoint comes from the environment polar gives a
session: POLAR_OPENHANDS_API picks the wire format (chat, responses or messages). Exit 0 when the
conversation finished, 1 otherwise (error, stuck, or its step limit reached)."""

import os
import sys

from openhands.sdk import LLM, Conversation
from openhands.sdk.conversation import ConversationExecutionStatus
from openhands.tools.preset.default import get_default_agent

api = os.environ.get("POLAR_OPENHANDS_API", "chat")
model = os.environ["POLAR_MODEL"]
if api == "messages":
    llm = LLM(model=f"anthropic/{model}", base_url=os.environ["ANTHROPIC_BASE_URL"],
              api_key=os.environ["ANTHROPIC_API_KEY"], usage_id="agent")
else:
    llm = LLM(model=f"openai/{model}", base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"],
              api_mode=api, usage_id="agent")
conversation = Conversation(agent=get_default_agent(llm, cli_mode=True), workspace=os.getcwd(),
                            max_iteration_per_run=int(os.environ.get("POLAR_MAX_STEPS", "30")), visualizer=None)
conversation.send_message(sys.argv[1])
conversation.run()
status = conversation.state.execution_status
print(f"openhands: {status.value}")
sys.exit(0 if status == ConversationExecutionStatus.FINISHED else 1)
