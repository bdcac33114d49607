from tests.llm.conftest import fake, relay, settings  # noqa: F401 (fixtures)
