//! Autograd with the Tensor API: gradients of a small function, the tape, no_grad, and a
//! shape error reported as a `Result`. Run: `cargo run --example autograd`.

fn main() -> anyhow::Result<()> {
    // The runtime: an embedded dispatcher and worker (GT_CONNECT=HOST:PORT uses a server).
    let _gt = gt::init()?;

    let x = gt::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?.requires_grad_(true)?;
    let w = gt::tensor(&[0.5, -1.0, 2.0])?.requires_grad_(true)?;

    // y = sum(relu(x * w) ^ 2): operators for the arithmetic, methods for the rest.
    let y = (&x * &w).relu()?.pow(2.0)?.sum()?;
    gt::debug::print_tape()?;
    y.backward()?;
    println!("y = {}", y.item()?);
    println!("dy/dx = {:?}", x.grad().expect("x requires grad").to_vec()?);
    println!("dy/dw = {:?}", w.grad().expect("w requires grad").to_vec()?);

    // Nothing is recorded under no_grad.
    {
        let _off = gt::no_grad();
        let z = x.matmul(&w)?;
        println!("x @ w = {:?} (requires_grad: {})", z.to_vec()?, z.requires_grad());
    }

    // Errors name the op and the shapes.
    if let Err(e) = x.matmul(&x) {
        println!("as expected: {e}");
    }
    Ok(())
}
