use super::*;

fn bucket(capacity: f64, cost: f64) -> BucketArguments {
    BucketArguments {
        capacity,
        rate: 1.0,
        cost,
        enforce: true,
        debt: 0.0,
        factor: 0.0,
        min_capacity: 0.0,
        lease: false,
        ban: None,
    }
}

fn bucket_reply(tokens: f64, sufficient: bool, booked: bool, multiplier: f64) -> BucketReply {
    BucketReply {
        tokens,
        sufficient,
        booked,
        multiplier,
        banned: None,
        ban_began: false,
    }
}

/// The command's arguments before the binary one, and that one spelled as text: numbers
/// (u32 counts and indexes, u16 shape indexes, doubles), a run's length as `xN`, and lease
/// names, read as `decide.lua` reads it.
fn arguments(command: &redis::Cmd) -> (Vec<String>, String) {
    let mut arguments: Vec<Vec<u8>> = command
        .args_iter()
        .map(|argument| match argument {
            redis::Arg::Simple(bytes) => bytes.to_vec(),
            _ => panic!("only simple arguments are sent"),
        })
        .collect();
    let binary = arguments.pop().unwrap();
    let text = arguments
        .into_iter()
        .map(|argument| String::from_utf8(argument).unwrap())
        .collect();
    let mut rest = &binary[..];
    let take = |rest: &mut &[u8], n: usize| {
        let (taken, left) = rest.split_at(n);
        *rest = left;
        taken.to_vec()
    };
    let u32_of = |bytes: Vec<u8>| u32::from_le_bytes(bytes.try_into().unwrap()) as usize;
    let f64_of = |bytes: Vec<u8>| f64::from_le_bytes(bytes.try_into().unwrap());
    let mut spelled = vec![f64_of(take(&mut rest, 8)).to_string()];
    let shape_count = u32_of(take(&mut rest, 4));
    spelled.push(shape_count.to_string());
    let mut shapes = Vec::new();
    for _ in 0..shape_count {
        let count = u32_of(take(&mut rest, 4));
        spelled.push(count.to_string());
        let mut leases = false;
        let mut bans = Vec::new();
        for _ in 0..count {
            let numbers: Vec<f64> = (0..6).map(|_| f64_of(take(&mut rest, 8))).collect();
            leases |= numbers[3] == 2.0;
            spelled.extend(numbers.iter().map(f64::to_string));
            let after = u32_of(take(&mut rest, 4));
            spelled.push(after.to_string());
            if after > 0 {
                for _ in 0..2 {
                    spelled.push(f64_of(take(&mut rest, 8)).to_string());
                }
            }
            bans.push(after > 0);
        }
        shapes.push((bans, leases));
    }
    let u16_of = |bytes: Vec<u8>| u16::from_le_bytes(bytes.try_into().unwrap()) as usize;
    while !rest.is_empty() {
        let shape = u16_of(take(&mut rest, 2));
        spelled.push(shape.to_string());
        let run = u16_of(take(&mut rest, 2));
        if run > 1 {
            spelled.push(format!("x{run}"));
        }
        let (bans, leases) = &shapes[shape - 1];
        for banned in bans {
            spelled.push(u32_of(take(&mut rest, 4)).to_string());
            if *banned {
                spelled.push(u32_of(take(&mut rest, 4)).to_string());
            }
        }
        if *leases {
            let length = u32_of(take(&mut rest, 4));
            spelled.push(String::from_utf8(take(&mut rest, length)).unwrap());
        }
    }
    (text, spelled.join(" "))
}

#[test]
fn keys_and_shapes_are_sent_once_each() {
    let login = [bucket(5.0, 1.0), bucket(100.0, 2.5)];
    let search = [bucket(5.0, 1.0)];
    let smoothed = [
        BucketArguments {
            debt: 2.5,
            ..bucket(5.0, 1.0)
        },
        BucketArguments {
            enforce: false,
            ..bucket(5.0, 1.0)
        },
    ];
    let mut call = DecideCall::for_requests(5);
    call.push(["per_ip:a", "global"], &login, None);
    call.push(["per_ip:b", "global"], &login, None);
    call.push(["per_ip:a"], &search, None);
    call.push(["per_ip:b", "global"], &smoothed, None);
    let exports = [
        bucket(5.0, 1.0),
        BucketArguments::lease(2, std::time::Duration::from_secs(60)),
    ];
    call.push(["per_ip:a", "exports:slots"], &exports, Some("f00d"));
    let script = Script::new("return 1");
    let (keys, sent) = arguments(&call.command(&script, 1_700_000_000_000_000));
    assert_eq!(
        keys.join(" "),
        format!(
            "EVALSHA {} 4 per_ip:a global per_ip:b exports:slots",
            script.get_hash()
        )
    );
    let expected = [
        // The call's deadline in the server's time.
        "1700000000000000",
        // Four shapes: login's two buckets, then search's one (capacity, rate, cost,
        // enforce, factor, min_capacity, and no ban rule), then a delaying bucket (enforce:
        // the tokens it may book down to) beside a shadow one, then a bucket and two slots
        // (enforce 2) leased for a minute.
        "4 2 5 1 1 1 0 0 0 100 1 2.5 1 0 0 0 1 5 1 1 1 0 0 0",
        "2 5 1 1 -2.5 0 0 0 5 1 1 0 0 0 0",
        "2 5 1 1 1 0 0 0 2 60000 1 2 0 0 0",
        // Per request: its shape, then its keys, then the name of its leases if it takes
        // slots.
        "1 1 2 1 3 2 2 1 3 3 2 4 1 4 f00d",
    ];
    assert_eq!(sent, expected.join(" "));
}

fn double(value: f64) -> Vec<u8> {
    value.to_le_bytes().to_vec()
}

/// The reply to a call of two requests (two buckets, then one): the first admitted, its
/// second bucket under a penalty of 0.5; the second refused.
fn reply_to_two_requests() -> Vec<u8> {
    [
        double(1.7e15),
        vec![0],
        vec![1],
        double(4.5),
        vec![1],
        double(0.0),
        vec![2],
        double(0.5),
        vec![0],
        double(3.0),
        vec![0],
    ]
    .concat()
}

/// Calls `check` with a call of two requests (two buckets, then one) and its reply.
fn with_two_requests(check: impl FnOnce(&DecideCall<'_>, &[u8])) {
    let two_buckets = [bucket(5.0, 1.0), bucket(5.0, 1.0)];
    let one_bucket = [bucket(5.0, 1.0)];
    let mut call = DecideCall::for_requests(2);
    call.push(["a", "b"], &two_buckets, None);
    call.push(["a"], &one_bucket, None);
    check(&call, &reply_to_two_requests());
}

#[test]
fn replies_are_split_by_request() {
    with_two_requests(|call, reply| {
        assert_eq!(
            call.parse_reply(reply).unwrap(),
            CallReply {
                server_time: 1.7e15,
                requests: Some(vec![
                    RequestReply {
                        admitted: true,
                        buckets: smallvec::smallvec![
                            bucket_reply(4.5, true, false, 1.0),
                            bucket_reply(0.0, false, false, 0.5)
                        ],
                    },
                    RequestReply {
                        admitted: false,
                        buckets: smallvec::smallvec![bucket_reply(3.0, false, false, 1.0)],
                    },
                ]),
            }
        );
        let late = [double(1.7e15), vec![1]].concat();
        assert_eq!(
            call.parse_reply(&late).unwrap(),
            CallReply {
                server_time: 1.7e15,
                requests: None,
            },
            "a late call charged nothing and says no more"
        );
    });
}

#[test]
fn replies_are_parsed_strictly() {
    with_two_requests(|call, reply| {
        let late = [double(1.7e15), vec![1]].concat();
        assert!(call.parse_reply(&[&late[..], &[0]].concat()).is_err());
        assert!(
            call.parse_reply(&reply[..reply.len() - 1]).is_err(),
            "too short"
        );
        assert!(
            call.parse_reply(&[reply, &[7]].concat()).is_err(),
            "leftover bytes"
        );
        let mut bad_flag = reply.to_vec();
        bad_flag[18] = 8;
        assert!(
            call.parse_reply(&bad_flag).is_err(),
            "an admitted request's bucket is not banned"
        );
        bad_flag[18] = 32;
        assert!(
            call.parse_reply(&bad_flag).is_err(),
            "flags are 1, 2, 4, 8, 16"
        );
        bad_flag[18] = 5;
        assert!(
            call.parse_reply(&bad_flag).is_err(),
            "a bucket that held its cost booked nothing"
        );
        bad_flag[18] = 2;
        assert!(
            call.parse_reply(&bad_flag).is_err(),
            "a flag of 2 takes the next 8 bytes for a multiplier: the rest no longer fits"
        );
        let mut bad_admitted = reply.to_vec();
        bad_admitted[9] = 2;
        assert!(
            call.parse_reply(&bad_admitted).is_err(),
            "admitted is 0 or 1"
        );
    });
}

#[test]
fn a_booked_bucket_is_read_only_for_an_admitted_request() {
    let delaying = [BucketArguments {
        debt: 2.0,
        ..bucket(2.0, 1.0)
    }];
    let mut call = DecideCall::for_requests(1);
    call.push(["a"], &delaying, None);
    let booked = [double(1.7e15), vec![0], vec![1], double(-1.0), vec![4]].concat();
    let requests = call.parse_reply(&booked).unwrap().requests.unwrap();
    assert_eq!(
        requests[0].buckets[..],
        [bucket_reply(-1.0, false, true, 1.0)]
    );
    let charge = Charge {
        capacity: 2.0,
        rate: 2.0,
        cost: 1.0,
        enforce: true,
        period: None,
        debt: 2.0,
    };
    let verdict = requests[0].buckets[0].verdict(&charge);
    assert!(verdict.booked && !verdict.sufficient);
    assert_eq!(verdict.wait, 0.5, "a token at 2 a second");
    let penalised = [
        double(1.7e15),
        vec![0],
        vec![1],
        double(-1.0),
        vec![6],
        double(0.5),
    ]
    .concat();
    let requests = call.parse_reply(&penalised).unwrap().requests.unwrap();
    assert_eq!(
        requests[0].buckets[0].verdict(&charge).wait,
        1.0,
        "half the rate"
    );
    let refused_but_booked = [double(1.7e15), vec![0], vec![0], double(-1.0), vec![4]].concat();
    assert!(
        call.parse_reply(&refused_but_booked).is_err(),
        "a refused request books nothing"
    );
}

#[test]
fn a_bucket_with_a_ban_rule_sends_its_ban_key_and_reads_its_ban() {
    let ban = Ban {
        after: 3,
        within: std::time::Duration::from_secs(60),
        duration: std::time::Duration::from_millis(1500),
    };
    let guarded = [
        BucketArguments {
            ban: Some(ban),
            ..bucket(5.0, 1.0)
        },
        bucket(100.0, 1.0),
    ];
    let mut call = DecideCall::for_requests(2);
    call.push(["tg:login:h:aa", "tg:global"], &guarded, None);
    call.push(["tg:login:h:bb", "tg:global"], &guarded, None);
    let script = Script::new("return 1");
    let (keys, sent) = arguments(&call.command(&script, 0));
    assert_eq!(
        keys[2..].join(" "),
        "5 tg:login:h:aa {tg:login:h:aa}|ban tg:global tg:login:h:bb {tg:login:h:bb}|ban"
    );
    assert_eq!(
        sent,
        "0 1 2 5 1 1 1 0 0 3 60000000 1500000 100 1 1 1 0 0 0 1 1 2 3 1 4 5 3"
    );

    let double = |value: f64| value.to_le_bytes().to_vec();
    let reply: Vec<u8> = [
        double(1.7e15),
        vec![0],
        // Banned for 812.5 s more: refused, nothing charged.
        vec![0],
        double(4.0),
        vec![1 | 8],
        double(812.5),
        double(99.0),
        vec![1],
        // This refusal began a ban.
        vec![0],
        double(0.2),
        vec![16],
        double(99.0),
        vec![1],
    ]
    .concat();
    let requests = call.parse_reply(&reply).unwrap().requests.unwrap();
    let charge = Charge {
        capacity: 5.0,
        rate: 1.0,
        cost: 1.0,
        enforce: true,
        period: None,
        debt: 0.0,
    };
    let banned = requests[0].buckets[0].verdict(&charge);
    assert!(banned.banned && !banned.sufficient && !banned.ban_began);
    assert_eq!(banned.wait, 812.5);
    let began = requests[1].buckets[0].verdict(&charge);
    assert!(began.ban_began && !began.banned && !began.sufficient);
    assert!((began.wait - 0.8).abs() < 1e-9);

    let mut admitted_yet_banned = reply.clone();
    admitted_yet_banned[9] = 1;
    assert!(call.parse_reply(&admitted_yet_banned).is_err());
    let mut began_while_sufficient = reply.clone();
    let at = reply.len() - 10;
    assert_eq!(began_while_sufficient[at], 16);
    began_while_sufficient[at] = 17;
    assert!(call.parse_reply(&began_while_sufficient).is_err());
}

#[test]
fn identical_requests_in_a_row_are_sent_as_a_run() {
    let plain = [
        bucket(5.0, 1.0),
        BucketArguments {
            enforce: false,
            ..bucket(3.0, 1.0)
        },
    ];
    let delaying = [BucketArguments {
        debt: 2.0,
        ..bucket(5.0, 1.0)
    }];
    let guarded = [BucketArguments {
        ban: Some(Ban {
            after: 3,
            within: std::time::Duration::from_secs(60),
            duration: std::time::Duration::from_secs(1),
        }),
        ..bucket(5.0, 1.0)
    }];
    let slots = [BucketArguments::lease(2, std::time::Duration::from_secs(1))];
    let mut call = DecideCall::for_requests(16);
    for _ in 0..3 {
        call.push(["a", "s"], &plain, None);
    }
    call.push(["b", "s"], &plain, None);
    call.push(["a", "s"], &plain, None);
    call.push(["a", "s"], &plain, None);
    for _ in 0..2 {
        call.push(["a"], &delaying, None);
        call.push(["a"], &delaying, None);
        call.push(["a"], &guarded, None);
        call.push(["x"], &slots, Some("one"));
        call.push(["x"], &slots, Some("one"));
    }
    let (_, sent) = arguments(&call.command(&Script::new("return 1"), 0));
    let requests = &sent[sent.find("1 x3").unwrap()..];
    assert_eq!(
        requests,
        [
            "1 x3 1 2 1 3 2 1 x2 1 2",
            // Booking, bans and slots go request by request.
            "2 1 2 1 3 1 4 4 5 one 4 5 one",
            "2 1 2 1 3 1 4 4 5 one 4 5 one",
        ]
        .join(" ")
    );
}

#[test]
fn a_run_is_replied_as_its_admitted_count_and_is_replayed_request_by_request() {
    let shape = [
        bucket(5.0, 1.0),
        BucketArguments {
            enforce: false,
            ..bucket(3.0, 1.0)
        },
    ];
    let mut call = DecideCall::for_requests(5);
    for _ in 0..4 {
        call.push(["a", "s"], &shape, None);
    }
    call.push(["b", "s"], &shape, None);
    let run_reply = |admitted: u8| {
        [
            double(1.7e15),
            vec![0],
            vec![admitted],
            double(2.5),
            vec![2],
            double(0.5),
            double(1.0),
            vec![0],
            // The request after the run: its own reply.
            vec![0],
            double(0.5),
            vec![0],
            double(0.0),
            vec![0],
        ]
        .concat()
    };
    let requests = call.parse_reply(&run_reply(2)).unwrap().requests.unwrap();
    let penalised = |tokens: f64, sufficient: bool| bucket_reply(tokens, sufficient, false, 0.5);
    let expected = [
        (
            true,
            penalised(1.5, true),
            bucket_reply(0.0, true, false, 1.0),
        ),
        // The shadow bucket, empty, refuses nothing and is charged nothing.
        (
            true,
            penalised(0.5, true),
            bucket_reply(0.0, false, false, 1.0),
        ),
        (
            false,
            penalised(0.5, false),
            bucket_reply(0.0, false, false, 1.0),
        ),
        (
            false,
            penalised(0.5, false),
            bucket_reply(0.0, false, false, 1.0),
        ),
        (
            false,
            bucket_reply(0.5, false, false, 1.0),
            bucket_reply(0.0, false, false, 1.0),
        ),
    ];
    assert_eq!(requests.len(), expected.len());
    for (reply, (admitted, first, second)) in requests.iter().zip(expected) {
        assert_eq!(reply.admitted, admitted);
        assert_eq!(reply.buckets[..], [first, second]);
    }
    for contradiction in [1, 3, 5] {
        assert!(
            call.parse_reply(&run_reply(contradiction)).is_err(),
            "{contradiction} admitted of a run whose buckets pay for 2"
        );
    }
    let mut bad_flag = run_reply(2);
    bad_flag[18] = 1;
    assert!(
        call.parse_reply(&bad_flag).is_err(),
        "a run's bucket flag is 0 or 2"
    );
}
