"""A resume pipeline in two gates: fan out to classify, fan in to rank.

Each item of a partition (one job opening) is one resume, stored as JSON bytes
``{"name": ..., "text": ...}``, or an *inbox*: a zip of resumes as uploaded,
whose item id starts with ``inbox``. At gate 0 an inbox unpacks itself by
spawning one item per resume (``resume-007.json`` becomes item ``resume-007``),
:data:`UNPACK_PAGE` per answer, and completes: the whole fan-out happens inside
statefeed, exactly once, and gate 1 waits for every resume it spawned.

Gate 0, *extract and classify* (fan-out: every resume on its own, in parallel)
    parses the skills and the years of experience out of the free text and
    classifies the candidate into a role (backend, frontend, data, devops) by
    which role's skills they have; the item moves to gate 1 carrying these
    enriched fields instead of the raw text.

Gate 1, *rank* (fan-in: a reduce gate)
    sees every classified resume of the opening at once, scores each one on
    one rubric (role fit, experience, breadth), ranks them, and stores the top
    ten as the partition result; each resume completes with its score, tier
    and rank. A partition created with ``reduce_gates=[1]`` sends gate 1 to
    ``POST /reduce`` instead of item by item.

Why gate 1 waits for gate 0: statefeed calls the reduce of gate 1 only after
every resume has settled gate 0, so the ranking compares every candidate on
the same classified fields. A resume that cannot be read fails at gate 0; a
partition created with ``on_item_failure="continue"`` ranks the others
anyway, and the result lists the failures.

The reduce is :data:`RANK`, a :class:`handlers.Reduce` of two plain functions:
:func:`keep_best` folds pages of resumes into the best ten so far, and
:func:`mark_ranks` answers each resume with its score and rank. A small
opening arrives in one call; a large one (over the processor's
``--reduce-page-items``) arrives in pages, and the same two functions serve both.

Serve with ``uvicorn handlers.examples.resumes:app``. The pure functions
(:func:`classify`, :func:`final_score`, :func:`keep_best`, :func:`mark_ranks`,
:func:`top_candidates`) work without any server; sample resumes to feed it come
from :func:`handlers.examples.samples.sample_resumes`.
"""

from __future__ import annotations

import base64
import io
import json
import re
import zipfile
from collections.abc import Iterable, Mapping
from typing import Any, Final

import handlers

ROLE_SKILLS: Final[dict[str, tuple[str, ...]]] = {
    "backend": ("python", "golang", "java", "rust", "postgresql", "redis", "kafka", "grpc",
                "django", "kubernetes"),
    "frontend": ("javascript", "typescript", "react", "vue", "svelte", "css", "html",
                 "webpack", "accessibility", "graphql"),
    "data": ("sql", "python", "pandas", "spark", "airflow", "dbt", "pytorch", "statistics",
             "tableau", "scikit-learn"),
    "devops": ("terraform", "aws", "gcp", "docker", "kubernetes", "ansible", "prometheus",
               "linux", "bash", "ci/cd"),
}
# A word in the job title that hints at the role; worth one matching skill.
ROLE_HINTS: Final[dict[str, tuple[str, ...]]] = {
    "backend": ("backend", "platform"),
    "frontend": ("frontend", "ui"),
    "data": ("data", "analytics"),
    "devops": ("devops", "reliability", "infrastructure"),
}
UNCLASSIFIED: Final = "general"
# Spellings found in resumes, mapped to the canonical skill.
SKILL_ALIASES: Final[dict[str, str]] = {
    "postgres": "postgresql", "k8s": "kubernetes", "js": "javascript", "ts": "typescript",
    "sklearn": "scikit-learn", "reactjs": "react", "react.js": "react", "vue.js": "vue",
    "go-lang": "golang", "amazon web services": "aws", "ci-cd": "ci/cd",
}
MAX_YEARS: Final = 50
# The rubric of final_score(): weights sum to 100.
FIT_WEIGHT, EXPERIENCE_WEIGHT, BREADTH_WEIGHT = 50.0, 35.0, 15.0
FULL_FIT_SKILLS: Final = 5  # this many skills of the role is a perfect fit
FULL_EXPERIENCE_YEARS: Final = 12
FULL_BREADTH_SKILLS: Final = 8
TIERS: Final = ((75.0, "A"), (55.0, "B"), (0.0, "C"))

ALL_SKILLS: Final = sorted({skill for skills in ROLE_SKILLS.values() for skill in skills})
_SPELLINGS: Final = {**{skill: skill for skill in ALL_SKILLS}, **SKILL_ALIASES}
# Longest spelling first so "react.js" wins over "react"; the look-arounds keep
# "sql" from matching inside "postgresql" and "java" inside "javascript".
_SKILL_PATTERN: Final = re.compile(
    r"(?<![\w+#/.-])("
    + "|".join(re.escape(s) for s in sorted(_SPELLINGS, key=len, reverse=True))
    + r")(?![\w+#/-]|\.\w)")
_YEARS_PATTERN: Final = re.compile(r"\b(\d{1,2})\s*\+?\s*(?:years?|yrs?)\b")
_WORD: Final = re.compile(r"[a-z]+")


# --------------------------------------------------------------------------- pure steps


def extract_skills(text: str) -> list[str]:
    """The canonical skills named in ``text``, sorted; aliases such as "k8s" count."""
    return sorted({_SPELLINGS[match] for match in _SKILL_PATTERN.findall(text.lower())})


def extract_years(text: str) -> int:
    """The largest "N years" / "N+ yrs" in ``text`` (capped at 50); 0 when none."""
    years = [int(found) for found in _YEARS_PATTERN.findall(text.lower())]
    return min(max(years, default=0), MAX_YEARS)


def classify(resume: Mapping[str, Any]) -> dict[str, Any]:
    """Gate 0's work: extract skills and years from a resume and pick its role.

    The role is the one whose skills the resume names most (a role word in the
    first line, such as "Frontend", counts as one more); ties go to the role
    listed first in :data:`ROLE_SKILLS`. A resume naming no role's skill is
    ``"general"``. Returns ``{"name", "role", "years", "skills", "role_skills",
    "fit"}`` where ``fit`` is the share of :data:`FULL_FIT_SKILLS` role skills
    found (0 to 1).

    Raises:
        ValueError: ``resume`` is not an object with a string ``text`` (and a
            string ``name``, when given).
    """
    if not isinstance(resume, Mapping):
        raise ValueError(f"a resume must be a JSON object, got {type(resume).__name__}")
    text, name = resume.get("text"), resume.get("name", "")
    if not isinstance(text, str):
        raise ValueError("a resume needs a 'text' string with the resume's content")
    if not isinstance(name, str):
        raise ValueError("a resume's 'name' must be a string")
    skills = extract_skills(text)
    first_line = set(_WORD.findall(text.lower().split("\n", 1)[0]))
    best_role, best_votes, best_matched = UNCLASSIFIED, 0, []
    for role, role_skills in ROLE_SKILLS.items():
        matched = [skill for skill in skills if skill in role_skills]
        votes = len(matched) + (1 if first_line.intersection(ROLE_HINTS[role]) else 0)
        if matched and votes > best_votes:
            best_role, best_votes, best_matched = role, votes, matched
    return {
        "name": name or "(no name)",
        "role": best_role,
        "years": extract_years(text),
        "skills": skills,
        "role_skills": best_matched,
        "fit": round(min(len(best_matched) / FULL_FIT_SKILLS, 1.0), 3),
    }


def final_score(enriched: Mapping[str, Any]) -> float:
    """Gate 1's rubric: a 0-100 score from the fields :func:`classify` produced.

    ``50 * fit + 35 * experience + 15 * breadth``, where experience saturates at
    12 years and breadth at 8 skills; rounded to 2 decimals.

    Raises:
        ValueError: a field is missing or has the wrong type (the item did not
            come through gate 0).
    """
    try:
        fit, years, skills = enriched["fit"], enriched["years"], enriched["skills"]
    except (KeyError, TypeError):
        raise ValueError("an enriched resume needs 'fit', 'years' and 'skills' (the "
                         "fields gate 0 adds)") from None
    if (isinstance(fit, bool) or not isinstance(fit, int | float) or not 0 <= fit <= 1
            or type(years) is not int or years < 0 or not isinstance(skills, list)):
        raise ValueError("'fit' must be a number from 0 to 1, 'years' an integer >= 0 and "
                         "'skills' a list")
    experience = min(years, FULL_EXPERIENCE_YEARS) / FULL_EXPERIENCE_YEARS
    breadth = min(len(skills), FULL_BREADTH_SKILLS) / FULL_BREADTH_SKILLS
    return round(FIT_WEIGHT * fit + EXPERIENCE_WEIGHT * experience + BREADTH_WEIGHT * breadth,
                 2)


def tier(score: float) -> str:
    """``"A"`` from 75, ``"B"`` from 55, else ``"C"``."""
    return next(name for floor, name in TIERS if score >= floor)


def top_candidates(items_data: Iterable[bytes], k: int) -> list[dict[str, Any]]:
    """The ``k`` best ranked candidates among the items' final bytes, best first.

    Items that were not ranked (failed, or still at gate 0 or 1: their data has
    no ``score``) are left out. Equal scores are ordered by name. Each row is
    ``{"rank", "name", "role", "years", "score", "tier", "skills"}`` with the
    role's skills.

    Raises:
        ValueError: ``k`` is negative.
    """
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    ranked: list[dict[str, Any]] = []
    for data in items_data:
        try:
            document = json.loads(data)
        except ValueError:
            continue
        score = document.get("score") if isinstance(document, dict) else None
        if isinstance(score, int | float) and not isinstance(score, bool):
            ranked.append(document)
    ranked.sort(key=lambda doc: (-doc["score"], str(doc.get("name", ""))))
    return [
        {"rank": position, "name": doc.get("name"), "role": doc.get("role"),
         "years": doc.get("years"), "score": float(doc["score"]), "tier": doc.get("tier"),
         "skills": doc.get("role_skills", [])}
        for position, doc in enumerate(ranked[:k], start=1)
    ]


# --------------------------------------------------------------------------- handlers


INBOX_PREFIX: Final = "inbox"
# Resumes one inbox answer spawns; a larger archive is unpacked over several calls.
UNPACK_PAGE: Final = 500


def intake(item: handlers.Item) -> handlers.Result:
    """Gate 0: an inbox unpacks (:func:`unpack`); a resume is classified (:func:`extract`)."""
    return unpack(item) if item.id.startswith(INBOX_PREFIX) else extract(item)


def unpack(item: handlers.Item) -> handlers.Result:
    """An inbox's step: spawn one resume per ``.json`` file of its zip, at gate 0.

    At most :data:`UNPACK_PAGE` per answer: until the last page, the answer keeps
    the archive and the next position in the inbox's data and asks to run again
    (``Result()`` at the same gate), so any number of resumes unpacks in bounded
    pieces. The last page completes the inbox with ``{"unpacked": n}``. Item ids
    come from the file names, so a step that runs again spawns the same ids.

    Raises:
        handlers.Fail: the data is not a zip archive (422, not retried).
    """
    if item.data.startswith(b"PK"):  # the archive as uploaded: the first page
        archive, start = item.data, 0
    else:
        state = item.json()
        archive, start = base64.b64decode(state["archive"]), state["next"]
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as files:
            names = sorted(name for name in files.namelist() if name.endswith(".json"))
            page = names[start:start + UNPACK_PAGE]
            spawn = [handlers.Spawn(name.rsplit("/", 1)[-1].removesuffix(".json"),
                                    files.read(name)) for name in page]
    except zipfile.BadZipFile as error:
        raise handlers.Fail(f"the inbox is not a zip archive ({error})") from None
    end = start + len(page)
    if end >= len(names):
        return handlers.Result(done=True, data={"unpacked": len(names)}, spawn=spawn)
    return handlers.Result(data={"archive": base64.b64encode(archive).decode("ascii"),
                                 "next": end}, spawn=spawn)


def inbox_archive(resumes: Iterable[bytes]) -> bytes:
    """A zip of ``resumes`` as ``resume-000.json``, ``resume-001.json``, ...: what an
    inbox item carries."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as files:
        for number, resume in enumerate(resumes):
            files.writestr(f"resume-{number:03}.json", resume)
    return buffer.getvalue()


def extract(item: handlers.Item) -> handlers.Result:
    """Gate 0: classify the resume and move it to gate 1 with the enriched fields.

    Raises:
        handlers.ItemDataError: the item is not JSON (400, not retried).
        handlers.Fail: the JSON is not a resume (422, not retried).
    """
    try:
        enriched = classify(item.json())
    except handlers.ItemDataError:
        raise
    except ValueError as error:
        raise handlers.Fail(str(error)) from None
    return handlers.Result(gate=1, data=enriched)


def rank(item: handlers.Item) -> handlers.Result:
    """Gate 1 item by item (for partitions without a reduce gate): score the
    classified resume on the shared rubric and complete it.

    Raises:
        handlers.ItemDataError: the item is not JSON (400, not retried).
        handlers.Fail: the item lacks the fields gate 0 adds (422, not retried).
    """
    return handlers.Result(done=True, data=scored(item))


def scored(item: handlers.Item) -> dict[str, Any]:
    """The classified resume of ``item`` with its ``score`` and ``tier``.

    Raises:
        handlers.ItemDataError: the item is not JSON.
        handlers.Fail: the item lacks the fields gate 0 adds.
    """
    # The processor names the partition, gate and attempt (and the item of a per-item
    # call) before the error it stores; in a reduce page only the item is ours to name.
    named = f"item {item.id!r}: " if item.in_reduce else ""
    enriched = item.json()
    if not isinstance(enriched, dict):
        raise handlers.Fail(f"{named}expected the JSON object gate 0 produces")
    try:
        score = final_score(enriched)
    except ValueError as error:
        raise handlers.Fail(f"{named}{error}") from None
    return {**enriched, "score": score, "tier": tier(score)}


TOP: Final = 10


def keep_best(best: dict[str, Any] | None, resumes: list[handlers.Item]) -> dict[str, Any]:
    """The fold of gate 1: the ``TOP`` best candidates so far, with this page's.

    The accumulator is ``{"top": [row, ...], "ranked": n, "failed": [{"id",
    "error"}, ...]}``: a few kilobytes whatever the size of the opening (the
    failures listed are capped at ``TOP``; ``failed_count`` counts them all).

    Raises:
        handlers.Fail: a resume lacks the fields gate 0 adds.
    """
    best = best or {"top": [], "ranked": 0, "failed": [], "failed_count": 0}
    rows = list(best["top"])
    failed = list(best["failed"])
    for resume in resumes:
        if resume.failed:
            if len(failed) < TOP:
                failed.append({"id": resume.id, "error": resume.last_error})
            continue
        data = scored(resume)
        rows.append({"id": resume.id, "name": data["name"], "role": data["role"],
                     "years": data["years"], "score": data["score"], "tier": data["tier"],
                     "skills": data["role_skills"]})
    rows.sort(key=lambda row: (-row["score"], str(row["name"]), row["id"]))
    return {"top": rows[:TOP], "ranked": best["ranked"] + sum(not r.failed for r in resumes),
            "failed": failed,
            "failed_count": best["failed_count"] + sum(r.failed for r in resumes)}


def mark_ranks(best: dict[str, Any], resumes: list[handlers.Item]
               ) -> dict[str, handlers.Result]:
    """The apply of gate 1: complete each resume with its score, tier and rank
    (``None`` outside the top ``TOP``).

    Raises:
        handlers.Fail: a resume lacks the fields gate 0 adds.
    """
    ranks = {row["id"]: position for position, row in enumerate(best["top"], start=1)}
    return {resume.id: handlers.Result(done=True, data={**scored(resume),
                                                         "rank": ranks.get(resume.id)})
            for resume in resumes if not resume.failed}


def opening_result(best: dict[str, Any]) -> dict[str, Any]:
    """The partition result: the ranked top ``TOP`` with their positions, and the failures."""
    return {"top": [{"rank": position, **row}
                    for position, row in enumerate(best["top"], start=1)],
            "ranked": best["ranked"], "failed": best["failed"],
            "failed_count": best["failed_count"]}


RANK: Final = handlers.Reduce(fold=keep_best, apply=mark_ranks, result=opening_result)

app = handlers.app({0: intake, 1: rank}, reduce=RANK)

# The same pipeline as two services, as ``processor demo`` runs it (a routes file sends
# each gate to its own): gate 0's unpack, extract and classify, and gate 1's rank.
steps_app = handlers.app({0: intake})
rank_app = handlers.app({1: rank}, reduce=RANK)


if __name__ == "__main__":
    handlers.serve(app)
