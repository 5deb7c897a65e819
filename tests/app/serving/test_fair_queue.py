"""The fair queue's order and admission (app/serving/fair_queue.py): one job per client per round,
a class behind one address served and giving way, an address's places in a round."""


def test_fair_order_serves_one_job_per_client_per_round():
    from app.serving.fair_queue import Job, Rounds, ServingLimits, admission, fair_key

    rounds = Rounds()
    flood = [Job(f"f{i}", "api@1.2.3.4", "1.2.3.4", f"f{i}", seq=i, round=rounds.assign("api@1.2.3.4"))
             for i in range(3)]
    victim = Job("v", "session:v", "5.6.7.8", "v", seq=10, round=rounds.assign("session:v"))
    order = sorted(flood + [victim], key=fair_key)
    assert [job.event_id for job in order] == ["f0", "v", "f1", "f2"]  # after one job of the other client
    rounds.started(order[0].round)  # f0 runs; the flood pushes again: behind the victim, not before
    later = Job("f3", "api@1.2.3.4", "1.2.3.4", "f3", seq=11, round=rounds.assign("api@1.2.3.4"))
    assert [job.event_id for job in sorted(order[1:] + [later], key=fair_key)] == ["v", "f1", "f2", "f3"]
    limits = ServingLimits(queue_size=4, per_session=2)
    waiting = flood + [victim]
    assert admission(waiting, "session:w", "9.9.9.9", limits) == ("displace", flood[2])  # full: the heaviest gives way
    verdict, _ = admission(flood[:1], "api@1.2.3.4", "1.2.3.4", limits)
    assert verdict.startswith("refuse") and "share 1 waiting" in verdict


def test_a_class_behind_one_address_fills_an_idle_queue_and_gives_way_to_other_addresses():
    from app.serving.fair_queue import Job, ServingLimits, admission

    limits = ServingLimits(queue_size=32, per_session=2)
    waiting: list[Job] = []
    for pupil in range(32):  # 32 page sessions of one NAT click together: every one is admitted
        verdict, _ = admission(waiting, f"session:p{pupil}", "10.0.0.1", limits)
        assert verdict == "admit", (pupil, verdict)
        waiting.append(Job(f"p{pupil}", f"session:p{pupil}", "10.0.0.1", f"p{pupil}", seq=pupil))
    verdict, victim = admission(waiting, "session:v", "5.6.7.8", limits)
    assert verdict == "displace" and victim is waiting[-1]  # a visitor elsewhere takes the class's newest place
    verdict, _ = admission(waiting, "session:late", "10.0.0.1", limits)
    assert verdict.startswith("refuse: the queue is full")  # a 33rd pupil: nobody of its address holds 2 more
    script = [Job(f"s{i}", "api@10.0.0.1", "10.0.0.1", f"s{i}", seq=100 + i) for i in range(3)]
    verdict, victim = admission(waiting[:29] + script, "session:late", "10.0.0.1", limits)
    assert verdict == "displace" and victim is script[-1]  # within the address, the heaviest client gives way
    capped = ServingLimits(queue_size=32, per_session=2, per_address=16)  # a deployer's cap still holds
    verdict, _ = admission(waiting[:16], "session:p16", "10.0.0.1", capped)
    assert verdict.startswith("refuse") and "limit per address is 16" in verdict


def test_one_address_takes_at_most_its_places_in_a_round():
    from app.serving.fair_queue import Rounds

    rounds = Rounds(places_per_address=2)
    script = [rounds.assign(f"session:{i}", "10.0.0.1") for i in range(6)]  # six page loads of one script
    assert script == [0, 0, 1, 1, 2, 2]
    assert rounds.assign("session:v", "10.0.0.2") == 0  # another address still gets the first round
