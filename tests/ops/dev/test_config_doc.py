"""docs/configuration.md says what the schema says: its tables are the generated ones."""

from __future__ import annotations

from ops.dev import config_doc


def test_the_configuration_page_is_the_schemas() -> None:
    text = config_doc.DOC.read_text()
    assert config_doc.render(text) == text, "python -m ops.dev.config_doc --write"


def test_every_field_of_the_schema_is_on_the_page() -> None:
    from deploy.config import IndexConfig, ServerConfig

    text = config_doc.DOC.read_text()
    for model in (ServerConfig, IndexConfig):
        for name in model.model_fields:
            assert f"| `{name}` |" in text, name
