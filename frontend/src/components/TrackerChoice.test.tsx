import { fireEvent, render, screen } from '@testing-library/react'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { jsonResponse } from '../test/fixtures'
import type { TrackerOption } from '../types'
import { TrackerChoice } from './TrackerChoice'

const options: TrackerOption[] = [
  { name: 'mlflow', label: 'MLflow', available: false, detail: 'MLflow is not set up on this studio' },
  { name: 'tensorboard', label: 'TensorBoard', available: true, detail: 'Event files' },
  { name: 'wandb', label: 'Weights & Biases', available: true, detail: 'An offline run' },
]

describe('TrackerChoice', () => {
  afterEach(() => vi.unstubAllGlobals())

  it('offers the trackers the studio has, MLflow off with its reason until an admin sets it up', async () => {
    vi.stubGlobal('fetch', vi.fn<typeof fetch>().mockResolvedValue(jsonResponse(options)))
    const onChange = vi.fn()
    render(<TrackerChoice chosen={['wandb']} onChange={onChange} />)
    expect(await screen.findByRole('checkbox', { name: /MLflow/ })).toBeDisabled()
    expect(screen.getByText('MLflow is not set up on this studio')).toBeInTheDocument()
    expect(screen.getByRole('checkbox', { name: /Weights & Biases/ })).toBeChecked()
    fireEvent.click(screen.getByRole('checkbox', { name: /TensorBoard/ }))
    expect(onChange).toHaveBeenLastCalledWith(['wandb', 'tensorboard'])
    fireEvent.click(screen.getByRole('checkbox', { name: /Weights & Biases/ }))
    expect(onChange).toHaveBeenLastCalledWith([])
  })
})
