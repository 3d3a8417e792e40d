"""Made-up resumes for the resume pipeline (:mod:`handlers.examples.resumes`): the demo's
data and the tests'."""

from __future__ import annotations

import json
import random
from typing import Final

from handlers.examples.resumes import ALL_SKILLS, ROLE_SKILLS

_FIRST_NAMES: Final = (
    "Ada", "Bilal", "Chen", "Dara", "Elif", "Farah", "Goran", "Hana", "Ines", "Jonas",
    "Kemi", "Lars", "Mei", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq",
    "Uma", "Vera", "Wen", "Ximena", "Yusuf", "Zofia",
)
_LAST_NAMES: Final = (
    "Okafor", "Lindqvist", "Moreau", "Tanaka", "Haddad", "Novak", "Fernandes", "Kowalski",
    "Mensah", "Iyer", "Schmidt", "Rossi", "Nakamura", "Oyelaran", "Petrov", "Duarte",
    "Kaur", "Byrne", "Castillo", "Yilmaz",
)
_TITLES: Final = {
    "backend": ("Backend Engineer", "Platform Developer", "Software Engineer"),
    "frontend": ("Frontend Developer", "UI Engineer", "Web Developer"),
    "data": ("Data Engineer", "Data Scientist", "Analytics Engineer"),
    "devops": ("DevOps Engineer", "Site Reliability Engineer", "Infrastructure Engineer"),
}
_SPELLED: Final = {  # how resumes write a skill: the first is the usual spelling
    "postgresql": ("PostgreSQL", "Postgres"), "kubernetes": ("Kubernetes", "K8s"),
    "javascript": ("JavaScript", "JS"), "typescript": ("TypeScript",), "react": ("React",
    "React.js"), "scikit-learn": ("scikit-learn", "sklearn"), "golang": ("Golang",),
    "grpc": ("gRPC",), "graphql": ("GraphQL",), "css": ("CSS",), "html": ("HTML",),
    "sql": ("SQL",), "aws": ("AWS",), "gcp": ("GCP",), "dbt": ("dbt",), "ci/cd": ("CI/CD",),
    "pytorch": ("PyTorch",), "vue": ("Vue", "Vue.js"),
}
_TEMPLATES: Final = (
    "{title}\n{name}. {years} years of experience. Skills: {skills}.",
    "{name} - {title}\n{years}+ years building production systems with {skills}.",
    "{title} ({years} yrs)\nDay to day I work with {skills}; I mentor and review code.",
    "{name}\n{title}, {years} years. Toolbox: {skills}. Open to relocation.",
)
_GRADUATE_TEMPLATE: Final = (
    "{title} (graduate)\n{name}. Recent graduate; coursework and projects in {skills}.")


def sample_resumes(n: int, seed: int = 42, *, unreadable: int = 0) -> list[bytes]:
    """``n`` fake resumes as JSON bytes ``{"name", "text"}``, the same for the same seed.

    Roles, skill spellings (aliases like "K8s"), years and wording vary; about
    one in eight is a recent graduate who states no years. The text is made up.
    ``unreadable`` of them (at seeded positions) are scans without a text
    layer, ``{"name", "scan"}``, which gate 0 refuses.

    Raises:
        ValueError: ``n`` or ``unreadable`` is negative, or ``unreadable > n``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0 <= unreadable <= n:
        raise ValueError(f"unreadable must be from 0 to n ({n}), got {unreadable}")
    rng = random.Random(seed)
    roles = list(ROLE_SKILLS)
    resumes: list[bytes] = []
    for _ in range(n):
        role = rng.choice(roles)
        own = rng.sample(ROLE_SKILLS[role], k=rng.randint(2, 6))
        others = [skill for skill in ALL_SKILLS if skill not in own]
        skills = own + rng.sample(others, k=rng.randint(0, 2))
        rng.shuffle(skills)
        shown = ", ".join(rng.choice(_SPELLED.get(skill, (skill.title(),))) for skill in skills)
        name = f"{rng.choice(_FIRST_NAMES)} {rng.choice(_LAST_NAMES)}"
        title = rng.choice(_TITLES[role])
        if rng.random() < 0.125:
            text = _GRADUATE_TEMPLATE.format(title=title, name=name, skills=shown)
        else:
            years = rng.choice((1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 20))
            if years >= 8:
                title = f"Senior {title}"
            text = rng.choice(_TEMPLATES).format(title=title, name=name, years=years,
                                                 skills=shown)
        resumes.append(json.dumps({"name": name, "text": text}).encode())
    for position in random.Random(seed + 1).sample(range(n), unreadable):
        name = json.loads(resumes[position])["name"]
        resumes[position] = json.dumps(
            {"name": name, "scan": "scanned PDF, no text layer"}).encode()
    return resumes
