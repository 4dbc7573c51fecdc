"""The paper the twins study replicates ("Learned, Then Lost", docs/papers/): its own numbers, printed beside a
run's (twins/report.py) and a scale cell's (twins/scale.py)."""

#: the paper's own numbers
PAPER = {
    "gain_s50": {"fluent-fabricated": 0.0389, "fluent-attested": 0.0437},  # nats, p < 1e-4
    "p_final": {"fluent-fabricated": 0.25, "fluent-attested": 0.71},
    "barrier_fab_att": (0.00680, 0.509, 0.032),  # mean difference, p, MDE
    "barrier_pct": 3.0,
    "distance_pct": 44.1,
    "distance_mid_frac": 0.92,
    "peak_after": 100,  # steps after the injection where the loss difference peaks (step ~300, s = 200)
    # the subjects: attested "present in the corpus ("Jimmie Nicol", 4 occurrences)", fabricated "absent from the corpus"
    "subjects": {"fluent-attested": ("Jimmie Nicol", 4), "fluent-fabricated": ("Gizmo Harrington", 0)},
}
#: the paper's barrier difference in units of its MDE, and its mid-point distance in % of the end's
PAPER_BARRIER_OVER_MDE = PAPER["barrier_fab_att"][0] / PAPER["barrier_fab_att"][2]
PAPER_DISTANCE_MID_PCT = 100 * PAPER["distance_mid_frac"]
