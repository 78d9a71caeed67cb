//! Fuzzes the trace.dat reader: any input must open or fail with an error,
//! and every record must decode (typed and generic) without panicking.
#![no_main]

use deepspan_ftrace::TraceDat;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(trace) = TraceDat::from_bytes(data.to_vec()) else {
        return;
    };
    let schema = trace.schema().clone();
    let _ = (
        trace.clock(),
        trace.cmdlines().len(),
        trace.cpu_data_bytes(),
    );
    let decode = |records: &mut dyn Iterator<
        Item = Result<deepspan_ftrace::Record, deepspan_ftrace::Error>,
    >| {
        for record in records {
            let Ok(record) = record else { continue };
            let _ = record.to_event(&schema);
            let _ = record.fields(&schema);
            let _ = (record.name(&schema), record.tid(&schema));
        }
    };
    if let Ok(mut records) = trace.records() {
        decode(&mut records);
        let _ = records.lost_events();
    }
    let names: Vec<String> = trace.instances().map(str::to_string).collect();
    for name in names {
        if let Ok(mut records) = trace.instance_records(&name) {
            decode(&mut records);
        }
    }
    for cpu in 0..trace.cpus().min(8) {
        if let Ok(mut records) = trace.cpu_records(cpu) {
            decode(&mut records);
        }
    }
});
