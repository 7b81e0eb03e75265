"""Reference answers to the course's exercises (the one source of every stub in exercises/).

    python tools/make_exercises.py

Never edit exercises/ by hand as an author: mark regions here and regenerate (see AUTHORING.md).
"""
