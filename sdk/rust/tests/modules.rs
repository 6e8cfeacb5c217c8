//! Switching measurement modules in a process of its own: with the profile module off, activities are not
//! profiled, and a stack begun before the switch does not make later activities its children.

use canopy_sdk::{activity, modules, set_modules};

#[test]
fn a_module_switched_off_sees_nothing_and_a_stack_from_before_is_dropped() {
    let outer = activity("outer").unwrap();
    let inner = activity("inner").unwrap();
    let timer = |name: &str| canopy_sdk::timer(name).unwrap();
    assert!(std::ptr::eq(timer("outer"), timer("outer")));
    assert_eq!(outer.index(), timer("outer").index());
    outer.begin();
    set_modules(&["null"]).unwrap();
    assert_eq!(modules(), ["null"]);
    // Unseen by the profile module.
    inner.begin();
    inner.end();
    set_modules(&["profile"]).unwrap();
    // The outer begin came before the switch: its stack is gone, so this inner call is not its child, and the
    // outer end that follows has no begin to match (ignored and counted).
    inner.begin();
    inner.end();
    assert_eq!(canopy_sdk::stats().mismatched_stops, 0);
    outer.end();
    assert_eq!(canopy_sdk::stats().mismatched_stops, 1);
    assert_eq!(
        set_modules(&["profile", "tracing"]).unwrap_err().to_string(),
        "unknown measurement module \"tracing\" (profile, trace, utilization, null)"
    );
    assert_eq!(modules(), ["profile"]);
}
