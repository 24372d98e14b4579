"""What the scheduler does with the plan, and how it is shown: samples, the placement linter,
metrics, HTTP, the journal and the learner (docs/architecture.md names each module's part)."""
