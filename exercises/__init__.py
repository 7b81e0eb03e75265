"""Your answers to the course's exercises: edit these files (see AUTHORING.md)."""
